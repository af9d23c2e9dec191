"""Evaluation: fixed prompts x fixed seeds at the eval step count, scored, for base or tuned weights.

The same (prompt, seed) pairs are used for every evaluation, during training and by `solrl eval`,
so two evaluations differ only by the weights: a rise is the model's, not the noise's.
`evaluate` scores a live training run; `evaluate_weights` loads a model (and a run's checkpoint)
on its own and scores several weight sets, writing one JSONL row per image. Both report their
progress (images generated) as they go: an evaluation of thousands of images takes minutes.

A training run keeps its base evaluation's per-image scores in its folder (`eval_base.json`), so a
resumed run compares its last evaluation with the base, paired standard errors included, as an
uninterrupted one does (`RunEvals`).

Eval rewards (`run.eval_rewards`) are scored on the same images besides the trained reward(s), never
trained on: each gets its base -> now change with a paired standard error, which the hacking rule
reads (hacking.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from solrl_core import events as ev
from solrl_core.config.schema import Config
from solrl_core.engine.engine import Engine, Progress
from solrl_core.errors import SolrlError
from solrl_core.loop.eval_pictures import EvalPictures
from solrl_core.loop.eval_rewards import HeldOut, held_out_rewards
from solrl_core.loop.session import Run
from solrl_core.rewards import RewardSet, Scores
from solrl_core.text import plural

EVAL_SEED_BASE = 1_000_000_007  # far from training seeds' typical draws; any fixed value works


@dataclass(frozen=True)
class Evaluation:
    weights: str
    prompts: list[str]
    seeds: torch.Tensor
    scores: Scores
    extras: dict[str, float]
    seconds: float
    # reward -> group -> image indices, for extras 'reward.group' that are group means
    groups: dict[str, dict[str, list[int]]]
    # eval reward -> per-image scores (run.eval_rewards)
    held_out: dict[str, torch.Tensor] = field(default_factory=dict)
    shown: torch.Tensor | None = None  # the few images a run's picture shows (`evaluate(keep=)`, eval_pictures.py)

    @property
    def mean(self) -> float:
        return float(self.scores.total.mean())


def eval_seeds(n_prompts: int, per_prompt: int) -> torch.Tensor:
    return EVAL_SEED_BASE + torch.arange(n_prompts * per_prompt, dtype=torch.long)


@torch.no_grad()
def evaluate(run: Run, prompts: list[str], per_prompt: int, weights: str, progress: Progress | None = None,
             held_out: HeldOut | None = None, stop: Callable[[], bool] | None = None, *,
             keep: list[int] | None = None) -> Evaluation:
    """Score `weights` ("base": adapters off, "ema": the EMA adapter, "trained": the live adapter).
    Once `stop()` says yes between two rollout batches, the evaluation is dropped (GenerationStopped).
    `keep`: the indices of the images to keep in `shown`; the others are let go once scored."""
    result, images = _score(run.engine, prompts, per_prompt, weights, progress, held_out, stop)
    return replace(result, shown=images[keep]) if keep else result


@torch.no_grad()
def _score(engine: Engine, prompts: list[str], per_prompt: int, weights: str,
           progress: Progress | None = None, held_out: HeldOut | None = None,
           stop: Callable[[], bool] | None = None) -> tuple[Evaluation, torch.Tensor]:
    """Generated and decoded one rollout batch at a time (engine.generate), `progress` told every few
    batches; then scored together with the engine's rewards, and the eval rewards on the same images."""
    t0 = time.perf_counter()
    flat = [p for p in prompts for _ in range(per_prompt)]
    seeds = eval_seeds(len(prompts), per_prompt)
    images = engine.images(flat, seeds, engine.config.sampler.eval_steps, weights, progress=progress, stop=stop)
    rewards = engine.rewards
    scores = rewards(images, flat)
    extra = {}
    if held_out is not None:
        other = held_out.rewards(images, flat).components if held_out.rewards is not None else {}
        extra = {n: scores.components[n] if n in scores.components else other[n] for n in held_out.names}
    return Evaluation(weights, prompts, seeds, scores, rewards.summary(scores, flat), time.perf_counter() - t0,
                      rewards.groups(flat), extra), images


@dataclass(frozen=True)
class EvalRequest:
    """What `solrl eval` scores: `weights` in order ('base' first gives the deltas), on these prompts."""

    config: Config  # model, sampler (eval_steps), rewards and device of the evaluation
    prompts: list[str]
    per_prompt: int
    weights: tuple[str, ...]
    checkpoint: Path | None  # a run's checkpoint folder; None = base model only
    out_dir: Path
    save_images: bool = False
    prompt_set: str = ""  # the name or file the prompts came from, for the record
    eval_rewards: tuple[str, ...] = ()  # scored besides the run's own reward(s), each base -> tuned (`--rewards`)
    # a run folder: its kept base evaluation (BASE_FILE) serves when it scored these images
    base_from: Path | None = None


class EvalStopped(Exception):
    """`solrl eval` ended by a stop request (Ctrl-C, SIGTERM, SIGHUP): `message` names the weight set
    dropped and what the output folder holds."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def evaluate_weights(req: EvalRequest, bus: ev.EventBus) -> list[Evaluation]:
    """Load the model once, score each weight set, write `samples.jsonl` and `summary.json` in out_dir.
    A first Ctrl-C, SIGTERM or SIGHUP stops it within a few seconds: while the model loads at once
    (KeyboardInterrupt), then between two rollout batches or a few seconds into a scoring call
    (rewards/watchdog.py), dropping the weight set in progress (EvalStopped); a second one at once."""
    from solrl_core.runtime.stopping import StopAtBoundary, StopFlag, graceful_stop

    with graceful_stop(StopFlag()) as flag:
        flag.announce = _at_once  # nothing is kept while the model loads
        engine, held_out = _open(req, lambda: flag.requested)
        flag.announce = None
        done: list[Evaluation] = []
        try:
            return _evaluate_sets(req, bus, engine, held_out, lambda: flag.requested, done)
        except StopAtBoundary as stop:
            kept = (f"{req.out_dir / 'samples.jsonl'} holds the rows of {', '.join(r.weights for r in done)} only"
                    if done else "no image was scored")
            raise EvalStopped(f"stopped ({flag.source}): the evaluation of the {req.weights[len(done)]} weights was "
                              f"dropped ({stop.message}); {kept}, and no summary.json was written") from None


def _at_once(flag: object) -> None:
    raise KeyboardInterrupt  # from the signal handler: user_errors says "stopped." and exits 130


def _open(req: EvalRequest, stop: Callable[[], bool]) -> tuple[Engine, HeldOut | None]:
    """The engine and the eval rewards of `req`, the prompts checked first; each reward's scoring call
    still running a few seconds after `stop()` says yes is abandoned (ScoringAbandoned)."""
    from solrl_core.engine.engine import open_engine
    from solrl_core.runtime.device import resolve_device

    cfg = req.config
    rewards = RewardSet.from_config(cfg.reward, resolve_device(cfg.run.device))
    rewards.check_prompts(req.prompts)  # before the model loads
    held_out = held_out_rewards(cfg, req.eval_rewards, resolve_device(cfg.run.device))
    for scorer in (rewards, held_out.rewards if held_out is not None else None):
        if scorer is not None:
            scorer.stop = stop
    return open_engine(cfg, checkpoint=req.checkpoint, rewards=rewards), held_out


def _evaluate_sets(req: EvalRequest, bus: ev.EventBus, engine: Engine, held_out: HeldOut | None,
                   stop: Callable[[], bool], results: list[Evaluation]) -> list[Evaluation]:
    """evaluate_weights' scoring: each set appended to `results` once scored, its rows written before
    the next set begins."""
    from solrl_core.io.images import save_png
    from solrl_core.io.atomic import write_atomic

    flat = [p for p in req.prompts for _ in range(req.per_prompt)]
    kept, origin = kept_base(req) if "base" in req.weights else (None, "")
    if kept is None and origin:
        bus.emit(ev.RunWarning(message=origin))
    req.out_dir.mkdir(parents=True, exist_ok=True)
    with open(req.out_dir / "samples.jsonl", "w", encoding="utf-8") as rows:
        for weights in req.weights:
            if weights == "base" and kept is not None:
                result, images = kept, None
            else:
                bus.emit(ev.EvalStarted(iteration=0, weights=weights,
                                        prompts=req.prompt_set or plural(len(req.prompts), "prompt"),
                                        samples=len(flat)))
                result, images = _score(engine, req.prompts, req.per_prompt, weights, progress_events(bus, 0, weights),
                                        held_out, stop)
            results.append(result)
            for i, prompt in enumerate(flat):
                row = {"weights": weights, "prompt": prompt, "seed": int(result.seeds[i]),
                       "reward": float(result.scores.total[i]),
                       **{f"reward.{k}": float(v[i]) for k, v in result.scores.components.items()},
                       **{f"eval.{k}": float(v[i]) for k, v in result.held_out.items()}}
                if req.save_images and images is not None:
                    path = req.out_dir / "images" / weights / f"{i:05d}.png"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    save_png(images[i], path)
                    row["image"] = str(path.relative_to(req.out_dir))
                rows.write(json.dumps(row) + "\n")
            bus.emit(ev.EvalFinished(iteration=0, weights=weights,
                                     prompts=req.prompt_set or plural(len(req.prompts), "prompt"), samples=len(flat),
                                     mean=result.mean,
                                     components={k: float(v.mean()) for k, v in result.scores.components.items()},
                                     extras=result.extras, seconds=result.seconds,
                                     delta_se=_delta_se(results[0], result),
                                     eval_rewards=_means(result.held_out),
                                     **_changes(results[0], result), reused=origin if images is None else ""))
    write_atomic(req.out_dir / "summary.json", json.dumps(summary(results), indent=2))
    return results


def kept_base(req: EvalRequest) -> tuple[Evaluation | None, str]:
    """The base evaluation the training run in `req.base_from` kept (BASE_FILE), when it scored the
    images `req` asks for: the same prompts, seeds, steps and rewards (RunEvals' key), every eval
    reward asked, and the model, sampler, device and dtype of the run's saved config; and when the
    file's digest is the one the run's events.jsonl recorded as it wrote it (a base evaluation event's
    `kept`). With it, where it came from ("RUN/eval_base.json, written DATE, digest ok"); without, why
    not when that is worth a warning (a digest that does not match), else ''. None when the images
    themselves are asked for (`save_images`): the base is scored again."""
    import datetime as dt

    from solrl_core.config.convert import load_run_config
    from solrl_core.tracking.compare import load_run

    cfg = req.config
    path = req.base_from / BASE_FILE if req.base_from is not None else None
    if path is None or req.save_images or not path.is_file():
        return None, ""
    run = load_run_config(req.base_from)
    if (run.model, run.sampler, run.run.device, run.run.dtype, run.run.tf32) != (
            cfg.model, cfg.sampler, cfg.run.device, cfg.run.dtype, cfg.run.tf32):
        return None, ""
    evals = RunEvals(req.base_from,
                     {"prompts": req.prompts, "per_prompt": req.per_prompt, "steps": cfg.sampler.eval_steps,
                                     "rewards": dict(cfg.reward.weights)}, write=False)
    if evals.restore(req.eval_rewards) or evals.base is None:  # a reason it cannot serve
        return None, ""
    try:
        written = [t.event for t in load_run(req.base_from).evals if t.event.weights == "base" and t.event.kept]
        found = digest(json.loads(path.read_text(encoding="utf-8")))
    except (SolrlError, ValueError, RecursionError, AttributeError):
        written, found = [], ""
    match = next((e for e in reversed(written) if e.kept == found), None)
    if match is None:
        return None, (f"{path} is not the base evaluation {req.base_from}'s events.jsonl recorded writing (its digest "
                      f"{'differs' if written else 'was never recorded'}): the base is scored again")
    when = dt.datetime.fromtimestamp(match.time, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (replace(evals.base, held_out={k: v for k, v in evals.base.held_out.items() if k in req.eval_rewards}),
            f"{path}, written {when}, digest ok")


def paired_se(values: torch.Tensor, ref: torch.Tensor) -> float:
    """Standard error of mean(values) - mean(ref) when both score the same (prompt, seed) images: the
    spread of the per-image differences over sqrt(n). 0 for a single image (no spread to measure)."""
    diff = (values.double() - ref.double())
    return float(diff.std(unbiased=True) / diff.numel() ** 0.5) if diff.numel() > 1 else 0.0


def summary(results: list[Evaluation]) -> dict:
    """Per weight set and reward: mean, std and the delta of the mean versus the first (base) set, with
    the delta's paired standard error ('delta_se'); the same for each group mean among the extras
    ('extras_delta' and 'extras_delta_se', e.g. per kind of prompt). The sets share prompts and seeds."""
    base = results[0]
    out: dict = {}
    for r in results:
        table = {}
        for name, values in {"total": r.scores.total, **r.scores.components}.items():
            ref = base.scores.total if name == "total" else base.scores.components[name]
            table[name] = {"mean": float(values.mean()), "std": float(values.std(unbiased=False)),
                           "delta": float(values.mean() - ref.mean()), "delta_se": paired_se(values, ref)}
        entry = {"rewards": table, "extras": r.extras, "samples": int(r.seeds.numel()), "seconds": r.seconds}
        if r.held_out:  # the eval rewards, each on the same images: base -> this set, paired
            entry["eval_rewards"] = {name: {"mean": float(values.mean()), "std": float(values.std(unbiased=False)),
                                            **({"delta": float(values.mean() - base.held_out[name].mean()),
                                                "delta_se": paired_se(values, base.held_out[name])}
                                               if name in base.held_out else {})}
                                     for name, values in r.held_out.items()}
        if r is not base:
            entry["extras_delta"] = {k: v - base.extras[k] for k, v in r.extras.items() if k in base.extras}
            entry["extras_delta_se"] = {}
            for reward, groups in r.groups.items():
                for group, members in groups.items():
                    idx = torch.tensor(members, dtype=torch.long)
                    entry["extras_delta_se"][f"{reward}.{group}"] = paired_se(r.scores.components[reward][idx],
                                                                            base.scores.components[reward][idx])
        out[r.weights] = entry
    return out


def _means(scores: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v.mean()) for k, v in scores.items()}


def _delta_se(base: Evaluation | None, result: Evaluation) -> dict[str, float]:
    """'mean' and each per-group extra: the standard errors of the change since the base; {} without
    one (or for the base itself)."""
    if base is None or result is base:
        return {}
    paired = summary([base, result])[result.weights]
    return {"mean": paired["rewards"]["total"]["delta_se"], **paired["extras_delta_se"]}


def _changes(base: Evaluation | None, result: Evaluation) -> dict[str, dict[str, float]]:
    """EvalFinished's 'eval_changes' and 'eval_se': each eval reward's change of mean since the base
    and its paired standard error (those the base holds); empty without a base."""
    if base is None or result is base:
        return {"eval_changes": {}, "eval_se": {}}
    shared = [k for k in result.held_out if k in base.held_out]
    return {"eval_changes": {k: float(result.held_out[k].mean() - base.held_out[k].mean()) for k in shared},
            "eval_se": {k: paired_se(result.held_out[k], base.held_out[k]) for k in shared}}


def progress_events(bus: ev.EventBus, iteration: int, weights: str) -> Progress:
    """A `Progress` that emits EvalProgress events on `bus`."""
    return lambda done, total: bus.emit(ev.EvalProgress(iteration=iteration, weights=weights, done=done, total=total))


BASE_FILE = "eval_base.json"  # in the run folder: the base evaluation's per-image scores


class RunEvals:
    """The evaluations a run's end compares: its base (scored as the run began, or read back from the
    run folder when it resumes) and the latest. Each later evaluation's change since the base gets
    paired standard errors from the base's per-image scores. `key`: what the scores depend on besides
    the weights (prompts, seeds per prompt, steps, rewards); a kept base of another key is not used."""

    def __init__(self, run_dir: Path, key: dict[str, Any], write: bool = True,
                 pictures: EvalPictures | None = None) -> None:
        self.path, self.key, self.write = run_dir / BASE_FILE, key, write
        self.pictures = pictures  # each evaluation's picture, base beside it (eval_pictures.py)
        self.base: Evaluation | None = None
        self.base_event: ev.EvalFinished | None = None
        self.last_event: ev.EvalFinished | None = None
        self.hacked = False  # the latest evaluation warned of reward hacking (run_eval._warn_of_hacking)
        self.short: list[str] = []  # the eval rewards whose loss the latest evaluation found too dear (run.min_trade)
        # this session's evaluations by iteration (a rollback's end shows its own)
        self.events: dict[int, ev.EvalFinished] = {}

    @classmethod
    def of(cls, run: Run) -> "RunEvals":
        cfg = run.config
        return cls(run.run_dir, {"prompts": run.eval_prompts, "per_prompt": cfg.run.eval_seeds,
                                 "steps": cfg.sampler.eval_steps, "rewards": dict(cfg.reward.weights)},
                   write=run.rank == 0,
                   pictures=EvalPictures(run.run_dir, run.eval_prompts, cfg.run.eval_seeds, write=run.rank == 0))

    def delta_se(self, result: Evaluation) -> dict[str, float]:
        """'mean' and each per-group extra: the standard errors of the change since the base; {} without one."""
        return _delta_se(self.base, result)

    def changes(self, result: Evaluation) -> dict[str, dict[str, float]]:
        """EvalFinished's eval_changes and eval_se (`_changes`)."""
        return _changes(self.base, result)

    def finished(self, result: Evaluation, event: ev.EvalFinished) -> None:
        """Keep an evaluation; a base one is also written to the run folder (atomically), for a resume."""
        from solrl_core.io.atomic import write_atomic

        self.events[event.iteration] = event
        if result.weights != "base":
            self.last_event = event
            return
        self.base, self.base_event = result, event
        if self.write:
            write_atomic(self.path, json.dumps({**self.record(result), "event": event.to_dict()}))

    def record(self, result: Evaluation) -> dict[str, Any]:
        """What BASE_FILE keeps of a base evaluation, besides its event (whose `kept` is this record's `digest`)."""
        return {**self.key, "total": result.scores.total.tolist(),
                "components": {k: v.tolist() for k, v in result.scores.components.items()},
                "extras": result.extras, "seconds": result.seconds, "groups": result.groups,
                "eval_rewards": {k: v.tolist() for k, v in result.held_out.items()}}

    def restore(self, eval_rewards: tuple[str, ...] = ()) -> str:
        """Read the base evaluation back from the run folder. Returns '' or why it cannot serve (missing,
        unreadable, or of other prompts, seeds, steps or rewards than the run now evaluates): a warning.
        A base without some of `eval_rewards` (kept before they were, or added on resume) serves the
        rest, and the warning names those that have no base -> now."""
        none = "the end summary has no base evaluation to compare with"
        if not self.path.is_file():
            return f"{self.path} is missing: {none}"
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            differs = [k for k, v in self.key.items() if saved[k] != v]
            if differs:
                return f"{self.path} was scored with other {', '.join(differs)} than the run now evaluates: {none}"
            self.base, self.base_event = _from_record(saved)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
            return f"{self.path} cannot be read ({type(exc).__name__}: {exc}): {none}"
        missing = [n for n in eval_rewards if n not in self.base.held_out]
        if missing:
            return (f"{self.path} holds no base scores of the eval reward{'s' * (len(missing) > 1)} "
                    f"{', '.join(missing)} (kept by an earlier solrl, or added since): no base -> now and no hacking "
                    f"check for {'them' if len(missing) > 1 else 'it'}; the trained reward still compares with its "
                    f"base")
        return ""

    def for_end(self) -> dict[str, Any]:
        """The RunFinished fields of the end summary: the base's and the latest evaluation's records."""
        last = self.last_event if self.base_event is not None else None
        return {"base_eval": self.base_event.to_dict() if self.base_event else None,
                "last_eval": last.to_dict() if last else None}


def digest(record: dict[str, Any]) -> str:
    """The SHA-256 of a kept base evaluation's scores (its record less its event), as the base's event records it."""
    import hashlib

    return hashlib.sha256(json.dumps({k: v for k, v in record.items() if k != "event"},
                                     sort_keys=True).encode()).hexdigest()


def _from_record(saved: dict[str, Any]) -> tuple[Evaluation, ev.EvalFinished]:
    event = ev.decode(saved["event"])
    if not isinstance(event, ev.EvalFinished):
        raise ValueError(f"its event is a {event.kind}, not an evaluation")
    scores = Scores(total=torch.tensor(saved["total"], dtype=torch.float32),
                    components={k: torch.tensor(v, dtype=torch.float32) for k, v in saved["components"].items()})
    seeds = eval_seeds(len(saved["prompts"]), saved["per_prompt"])
    # absent in older files
    held_out = {k: torch.tensor(v, dtype=torch.float32) for k, v in saved.get("eval_rewards", {}).items()}
    return Evaluation("base", saved["prompts"], seeds, scores, saved["extras"], saved["seconds"], saved["groups"],
                      held_out), event
