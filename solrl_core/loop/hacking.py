"""Reward hacking: when an evaluation counts as one, and the verdicts a run keeps.

The rule (`flagged`): an eval reward (run.eval_rewards) is flagged at an evaluation when the
trained reward (the evaluation's total) rose since the base while that eval reward fell by more
than SIGNIFICANCE paired standard errors *and* by more than its floor. Significance alone says
nothing of size: with thousands of paired images the standard error is tiny and any shift passes
(the default tiny run once moved tinyworld_fidelity by -0.047 +- 0.0004). The floor is the fall
that matters: each reward declares one with its reason (rewards/registry.py, Floor; how each was
chosen is in docs/rewards.md), run.hacking_floors overrides it per run, and a floor declared as a
share of the spread is resolved against the base evaluation's images.

Each evaluation's verdict (the trained reward's gain and standard error, the eval rewards it
flagged) is kept in the loop state, so in the checkpoint of that iteration: `best_checkpoint`
(`solrl export/eval RUN --best`) and a rollback (rollback.py) read them there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solrl_core.config.convert import load_run_config
from solrl_core.config.schema import Config
from solrl_core.engine.checkpoint import list_checkpoints
from solrl_core.errors import SolrlError
from solrl_core.loop.evaluation import Evaluation, paired_se
from solrl_core.loop.frontier import frontier_choice
from solrl_core.rewards.endpoints import is_endpoint
from solrl_core.rewards.registry import PLUGIN_FLOOR, Floor, lookup

SIGNIFICANCE = 2.0  # paired standard errors a fall must exceed, besides its floor


@dataclass(frozen=True)
class Fall:
    """An eval reward flagged at an evaluation: its change since the base, that change's paired
    standard error, and the floor it fell past."""

    reward: str
    change: float
    se: float
    floor: float


def declared_floor(name: str) -> Floor:
    """The floor reward `name` declares; a plugin's or a URL reward's default where it declares none."""
    info = None if is_endpoint(name) else lookup(name)
    return info.floor if info is not None and info.floor is not None else PLUGIN_FLOOR


def floors(cfg: Config, base: Evaluation) -> dict[str, float]:
    """Each eval reward's floor in its own units: run.hacking_floors, else the declared one (a share
    of the spread resolved on `base`'s images)."""
    return {name: cfg.run.hacking_floors[name] if name in cfg.run.hacking_floors
            else declared_floor(name).resolve(float(values.double().std(unbiased=False)))
            for name, values in base.held_out.items()}


def flagged(base: Evaluation, now: Evaluation, floor: dict[str, float]) -> list[Fall]:
    """The eval rewards that fell by more than SIGNIFICANCE paired standard errors and more than their
    floor since the base, while the trained reward rose; [] when it did not rise. A fall with a
    standard error of 0 (every image moved alike) passes the significance test."""
    if float(now.scores.total.mean() - base.scores.total.mean()) <= 0:
        return []
    out = []
    for name, values in now.held_out.items():
        if name in base.held_out:
            change, se = float(values.mean() - base.held_out[name].mean()), paired_se(values, base.held_out[name])
            if change < 0 and -change > SIGNIFICANCE * se and -change > floor.get(name, 0.0):
                out.append(Fall(name, change, se, floor.get(name, 0.0)))
    return out


def verdict(iteration: int, base: Evaluation, now: Evaluation, fell: list[Fall]) -> dict[str, Any]:
    """What the loop state keeps of an evaluation (trainer_state.json "evaluations"); "changes": each
    eval reward's change since the base, which the frontier rule reads (frontier.py)."""
    return {"iteration": iteration, "gain": float(now.scores.total.mean() - base.scores.total.mean()),
            "se": paired_se(now.scores.total, base.scores.total) if now is not base else 0.0,
            "flagged": [f.reward for f in fell],
            "changes": {k: float(v.mean() - base.held_out[k].mean()) for k, v in now.held_out.items()
                        if k in base.held_out}}


def clean(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evaluations if not e["flagged"]]


def spared(evaluations: list[dict[str, Any]], min_trade: float = 0.0) -> set[str]:
    """The checkpoints pruning keeps beyond the newest run.keep_checkpoints: the newest one whose
    evaluation no rule flagged (a rollback's target), the one with the highest gain among those, and the
    one the frontier walk at run.min_trade names (--best's, frontier.py; the same one at 0)."""
    good = clean(evaluations)
    if not good:
        return set()
    newest, best = max(good, key=lambda e: e["iteration"]), max(good, key=lambda e: (e["gain"], e["iteration"]))
    walked, _ = frontier_choice(good, min_trade)
    return {f"iter_{e['iteration']:06d}" for e in (newest, best, walked)}


def rollback_target(run_dir: Path, evaluations: list[dict[str, Any]], before: int) -> Path | None:
    """The newest checkpoint of `run_dir` saved at an evaluation before iteration `before` that no rule flagged."""
    on_disk = {p.name: p for p in list_checkpoints(run_dir)}
    for e in sorted(clean(evaluations), key=lambda e: -e["iteration"]):
        if e["iteration"] < before and f"iter_{e['iteration']:06d}" in on_disk:
            return on_disk[f"iter_{e['iteration']:06d}"]
    return None


def checkpoint_verdict(path: Path) -> dict[str, Any] | None:
    """The verdict of the evaluation made at checkpoint `path`'s own iteration, as its trainer_state.json
    holds it (every value checked against its schema); None if none was made. Not yet checked against
    the run's events: `Verdicts` is what --best and the model card read."""
    from solrl_core.engine.state_schema import read_trainer_state

    state = read_trainer_state(path)  # every value checked against its schema: a folder is data
    return next((e for e in state.get("evaluations", []) if e["iteration"] == state["iteration"]), None)


GAIN_TOLERANCE = 1e-5  # a verdict's gain against its events' means: float32 means, differenced in float64


class Verdicts:
    """The verdicts of a run's checkpoints that its events.jsonl bears out: a checkpoint's verdict is used
    only when the iteration is one the run's schedule evaluates (every run.eval_every, and each session's
    last) and events.jsonl holds an evaluation there whose mean less a base evaluation's is the
    verdict's gain (the base's own verdict, at iteration 0, gains 0). trainer_state.json is data anyone who can write
    the folder can rewrite (manifest
    and all): a verdict nothing else records is not believed. The one function --best (`best_checkpoint`),
    the model card and any other rule over the verdicts read them through."""

    def __init__(self, run_dir: Path) -> None:
        from solrl_core.tracking.compare import load_run

        self.run_dir = run_dir
        try:
            record = load_run(run_dir)
            self.problem = ""
        except SolrlError as exc:
            record, self.problem = None, f"its events.jsonl cannot be read ({exc.message})"
        evals = [t.event for t in record.evals] if record else []
        self.bases = [e.mean for e in evals if e.weights == "base"]
        # the base's own too: its verdict (iteration 0) gains 0; with each eval reward's change, which the frontier walk
        # reads
        self.scored = [(e.iteration, e.mean, e.eval_changes) for e in evals]
        self.every, self.ends = (record.eval_every, record.ends) if record else (0, set())

    def scheduled(self, iteration: int) -> bool:
        return iteration in self.ends or (self.every > 0 and iteration % self.every == 0)

    def of(self, checkpoint: Path) -> tuple[dict[str, Any] | None, str]:
        """The checkpoint's verdict (None when it was not evaluated or is not borne out) and, when one is
        stored but not borne out, the one line that says so, naming the checkpoint ('' otherwise)."""
        v = checkpoint_verdict(checkpoint)
        if v is None:
            return None, ""
        it, gain = v["iteration"], v["gain"]
        if self.problem:
            why = self.problem
        elif not self.scheduled(it):
            why = f"iteration {it} is not one the run evaluates (every {self.every or '?'} and each session's last)"
        elif not any(i == it and abs(mean - base - gain) <= GAIN_TOLERANCE and _same(v.get("changes", {}), changes)
                     for i, mean, changes in self.scored for base in self.bases):
            why = (f"events.jsonl records no evaluation at iteration {it} with a gain of {gain:+.4f} since the base"
                   + (" and these eval rewards' changes" if v.get("changes") else ""))
        else:
            return v, ""
        return None, (f"{checkpoint.name}'s trainer_state.json holds a verdict ({gain:+.4f}) that the run's events do "
                      f"not bear out: {why}; not used")


def _same(stored: dict[str, Any], recorded: dict[str, float]) -> bool:
    """A verdict's eval-reward changes are those its evaluation event recorded (each within GAIN_TOLERANCE;
    one the event does not record is 0, as the base's own verdict holds it)."""
    return all(abs(x - recorded.get(k, 0.0)) <= GAIN_TOLERANCE for k, x in stored.items())


def best_checkpoint(run_dir: Path) -> tuple[Path, str, list[str]]:
    """Among the checkpoints whose evaluation no rule flagged, the one the frontier walk names
    (frontier.frontier_choice at the run's run.min_trade: with 0, the highest trained-reward gain, the
    least eval-reward damage on a tie, then the newest), why in a sentence (the model card's), and a line
    for each checkpoint whose stored verdict the run's events do not bear out (`Verdicts`), left out."""
    verdicts = Verdicts(run_dir)
    checked = [(path, *verdicts.of(path)) for path in list_checkpoints(run_dir)]
    rated = [(p, v) for p, v, _ in checked if v is not None]
    mismatched = [line for _, _, line in checked if line]
    good = [(p, v) for p, v in rated if not v["flagged"]]
    bad = [f"{p.name} ({', '.join(v['flagged'])})" for p, v in rated if v["flagged"]]
    if not good:
        why = (f"its evaluated checkpoints were all flagged: {'; '.join(bad)}" if bad else "none of its checkpoints "
                                                                                           "was evaluated")
        why += f" ({'; '.join(mismatched)})" if mismatched else ""
        raise SolrlError(f"--best found no checkpoint of {run_dir} that an evaluation passed: {why}",
                         "choose one with --checkpoint iter_N, or train with run.eval_prompts set (each evaluation "
                         "saves a checkpoint)")
    v, stopped = frontier_choice([v for _, v in good], load_run_config(run_dir).run.min_trade)
    path = next(p for p, w in good if w is v)
    why = (f"{path.name}: " + (f"{stopped} (gain since the base {v['gain']:+.4f} +- {v['se']:.4f} s.e.)" if stopped else
           f"the highest trained-reward gain since the base ({v['gain']:+.4f} +- {v['se']:.4f} s.e.)")
           + f" among the {len(good)} evaluated checkpoint{'s' * (len(good) > 1)} no hacking rule flagged")
    return path, why + (f"; flagged: {'; '.join(bad)}" if bad else ""), mismatched


def deprecation(cfg: Config) -> str:
    """The warning a run with the deprecated run.stop_on_hacking=true gets ('' without it)."""
    return ("run.stop_on_hacking is deprecated: it reads as run.on_hacking=stop; set that instead"
            if cfg.run.stop_on_hacking else "")
