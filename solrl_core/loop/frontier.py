"""The trade between alignment and damage: how much trained-reward gain each stretch of training bought
per unit of an eval reward lost, and which checkpoint `--best` takes on that frontier.

Over-optimisation of a learned or programmatic reward is the rule, not the exception (Gao, Schulman and
Hilton 2023, "Scaling Laws for Reward Model Overoptimization": the proxy keeps rising after the gold
reward turns; Flow-GRPO and DiffusionNFT report the same for images). An eval reward (run.eval_rewards,
never trained on, e.g. tinyworld_fidelity) stands in for the gold one. What each evaluation can say:
the gain in the trained reward since the previous evaluation, per unit of each eval reward lost since
then (`trade`). Early in a run a little damage buys a lot of gain; later the same damage buys little.

- `trade` is reported at every evaluation (EvalFinished.trade) and shown in the run's lines.
- run.min_trade > 0 stops a run at the first evaluation whose stretch bought less (the early stop;
  `too_little`).
- `--best` takes the checkpoint the frontier rule names (`frontier_choice`).

All pure functions over the verdicts the loop state keeps (hacking.verdict): an iteration, the gain
since the base, its standard error, the rules that flagged it and, since this module, each eval
reward's change since the base ("changes"). A verdict written before that field holds no changes: it
counts as losing nothing, so a run of an older version gets the highest gain, as --best gave it then.
"""

from __future__ import annotations

from typing import Any

Verdict = dict[str, Any]
RULE = "frontier walk"  # the name docs/rewards.md and --best's sentence use


def trade(before: Verdict | None, gain: float, changes: dict[str, float], se: dict[str, float],
          significance: float) -> dict[str, float] | None:
    """Per eval reward that fell since `before` (the previous evaluation's verdict; None: since the base)
    by more than `significance` times its paired standard error since the base (`se`: the evaluation's
    noise, so noise is not sold as damage): the trained-reward gain since then divided by that fall. A
    reward that did not fall so far is left out (nothing lost). None when `before` holds no changes
    (a verdict of an older version): the stretch cannot be measured."""
    if before is not None and "changes" not in before:
        return None
    gain_before = before["gain"] if before is not None else 0.0
    changes_before = before["changes"] if before is not None else {}
    out = {}
    for name, change in changes.items():
        lost = changes_before.get(name, 0.0) - change
        if lost > 0 and lost > significance * se.get(name, 0.0):
            out[name] = (gain - gain_before) / lost
    return out


def too_little(traded: dict[str, float] | None, min_trade: float) -> list[str]:
    """The eval rewards whose trade fell short of `min_trade` (run.min_trade; 0 = the rule is off)."""
    if not traded or min_trade <= 0:
        return []
    return sorted(name for name, t in traded.items() if t < min_trade)


def previous(verdicts: list[Verdict], iteration: int) -> Verdict | None:
    """The verdict of the newest evaluation before `iteration` (the base's is iteration 0); None: none."""
    earlier = [v for v in verdicts if v["iteration"] < iteration]
    return max(earlier, key=lambda v: v["iteration"]) if earlier else None


def _changes(v: Verdict) -> dict[str, float]:
    return v.get("changes", {})


def _dominates(a: Verdict, b: Verdict) -> bool:
    """a is at least as good as b on the gain and on every eval reward's change, and better on one (or,
    equal on all, newer)."""
    names = set(_changes(a)) | set(_changes(b))
    ca, cb = _changes(a), _changes(b)
    if a["gain"] < b["gain"] or any(ca.get(n, 0.0) < cb.get(n, 0.0) for n in names):
        return False
    equal = a["gain"] == b["gain"] and all(ca.get(n, 0.0) == cb.get(n, 0.0) for n in names)
    return not equal or a["iteration"] > b["iteration"]


def frontier(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts no other dominates (the Pareto frontier of gain against each eval reward's change
    since the base), lowest gain first."""
    kept = [v for v in verdicts if not any(_dominates(w, v) for w in verdicts if w is not v)]
    return sorted(kept, key=lambda v: (v["gain"], v["iteration"]))


def frontier_choice(verdicts: list[Verdict], min_trade: float) -> tuple[Verdict, str]:
    """The frontier walk: along the frontier from its lowest-gain point, step to the next while that step
    bought at least `min_trade` gain per unit of every eval reward it lost; the point the walk stops at,
    and why, in a phrase ('' when it ran to the highest gain). With min_trade 0, or without eval
    rewards, that is the highest gain (the least damage on a tie of gains). `verdicts`: non-empty,
    already validated and unflagged."""
    if not verdicts:
        raise ValueError("frontier_choice needs at least one verdict")
    points = frontier(verdicts)
    chosen = points[0]
    for nxt in points[1:]:
        bought, was, now = nxt["gain"] - chosen["gain"], _changes(chosen), _changes(nxt)
        lost = {n: was.get(n, 0.0) - now.get(n, 0.0) for n in set(was) | set(now)}
        short = {n: bought / fall for n, fall in lost.items() if fall > 0 and bought / fall < min_trade}
        if short:
            name, t = min(short.items(), key=lambda kv: kv[1])
            return chosen, (f"the {RULE} stopped before iteration {nxt['iteration']}: its {bought:+.4f} gain cost "
                            f"{lost[name]:.4f} {name}, {t:.3g} per unit, below run.min_trade {min_trade:g}")
        chosen = nxt
    return chosen, ""
