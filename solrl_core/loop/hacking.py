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
            "changes": {k: float(v.mean() - base.held_out[k].mean()) for k, v in now.held_out.items() if k in base.held_out}}


def clean(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evaluations if not e["flagged"]]


def spared(evaluations: list[dict[str, Any]]) -> set[str]:
    """The checkpoints pruning keeps beyond the newest run.keep_checkpoints: the newest one whose
    evaluation no rule flagged (a rollback's target) and the one with the highest gain among those (--best)."""
    good = clean(evaluations)
    if not good:
        return set()
    newest, best = max(good, key=lambda e: e["iteration"]), max(good, key=lambda e: (e["gain"], e["iteration"]))
    return {f"iter_{e['iteration']:06d}" for e in (newest, best)}


def rollback_target(run_dir: Path, evaluations: list[dict[str, Any]], before: int) -> Path | None:
    """The newest checkpoint of `run_dir` saved at an evaluation before iteration `before` that no rule flagged."""
    on_disk = {p.name: p for p in list_checkpoints(run_dir)}
    for e in sorted(clean(evaluations), key=lambda e: -e["iteration"]):
        if e["iteration"] < before and f"iter_{e['iteration']:06d}" in on_disk:
            return on_disk[f"iter_{e['iteration']:06d}"]
    return None


def checkpoint_verdict(path: Path) -> dict[str, Any] | None:
    """The verdict of the evaluation made at checkpoint `path`'s own iteration; None if none was made."""
    from solrl_core.engine.state_schema import read_trainer_state

    state = read_trainer_state(path)  # every value checked against its schema: a folder is data
    return next((e for e in state.get("evaluations", []) if e["iteration"] == state["iteration"]), None)


def best_checkpoint(run_dir: Path) -> tuple[Path, str]:
    """Among the checkpoints whose evaluation no rule flagged, the one the frontier walk names
    (frontier.frontier_choice at the run's run.min_trade: with 0, the highest trained-reward gain, the
    least eval-reward damage on a tie, then the newest), and why, in a sentence (the model card's)."""
    rated = [(path, checkpoint_verdict(path)) for path in list_checkpoints(run_dir)]
    good = [(p, v) for p, v in rated if v is not None and not v["flagged"]]
    bad = [f"{p.name} ({', '.join(v['flagged'])})" for p, v in rated if v is not None and v["flagged"]]
    if not good:
        why = f"its evaluated checkpoints were all flagged: {'; '.join(bad)}" if bad else "none of its checkpoints was evaluated"
        raise SolrlError(f"--best found no checkpoint of {run_dir} that an evaluation passed: {why}",
                         "choose one with --checkpoint iter_N, or train with run.eval_prompts set (each evaluation saves a checkpoint)")
    v, stopped = frontier_choice([v for _, v in good], load_run_config(run_dir).run.min_trade)
    path = next(p for p, w in good if w is v)
    why = (f"{path.name}: " + (f"{stopped} (gain since the base {v['gain']:+.4f} +- {v['se']:.4f} s.e.)" if stopped else
           f"the highest trained-reward gain since the base ({v['gain']:+.4f} +- {v['se']:.4f} s.e.)")
           + f" among the {len(good)} evaluated checkpoint{'s' * (len(good) > 1)} no hacking rule flagged")
    return path, why + (f"; flagged: {'; '.join(bad)}" if bad else "")


def deprecation(cfg: Config) -> str:
    """The warning a run with the deprecated run.stop_on_hacking=true gets ('' without it)."""
    return ("run.stop_on_hacking is deprecated: it reads as run.on_hacking=stop; set that instead"
            if cfg.run.stop_on_hacking else "")
