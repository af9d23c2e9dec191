"""The lines a run ends with under its last one: the Stage-2 reward's change and the evaluation's
change since the base, with paired standard errors. Read from the RunFinished event alone, so the
plain display, `--tui` (once its app has closed) and a resumed run say the same."""

from __future__ import annotations

import shlex

from solrl_core import events as ev
from solrl_core.text import plural


def fmt(x: float | None) -> str:
    """Rewards live on very different scales (JPEG KB/500 vs. 0..1 scores): 4 significant digits."""
    return "-" if x is None else f"{x:.4g}"


def eval_rewards_text(e: ev.EvalFinished) -> str:
    """'NAME base B -> now N (change +- s.e.; floor F); ...' per eval reward of an evaluation (run.eval_rewards),
    F the fall that counts as hacking (loop/hacking.py); the mean alone where it has no base to compare
    with (the base itself, or a base kept without it)."""
    parts = []
    for name, now in e.eval_rewards.items():
        change, se = e.eval_changes.get(name), e.eval_se.get(name)
        floor = f"floor {e.eval_floors[name]:.4g}" if name in e.eval_floors else ""
        if change is None:
            parts.append(f"{name} {fmt(now)}" + (f" (hacking {floor})" if floor else ""))
            continue
        pm = f" +- {se:.4f} s.e." if se is not None else ""
        parts.append(f"{name} base {fmt(now - change)} -> {e.weights} {fmt(now)} ({change:+.4f}{pm}"
                     + (f"; {floor}" if floor else "")
                     + _trade_text(e, name) + ")")
    return "; ".join(parts)


def _trade_text(e: ev.EvalFinished, name: str) -> str:
    """'; since iteration P: G gain per unit lost' (loop/frontier.py), or nothing lost beyond noise; '' unmeasured."""
    if e.trade_since < 0:
        return ""
    since = "since the base" if e.trade_since == 0 else f"since iteration {e.trade_since}"
    return (f"; {since}: {e.trade[name]:.3g} gain per unit lost" if name in e.trade else f"; {since}: none lost beyond "
                                                                                         f"noise")


def end_summary(e: ev.RunFinished) -> list[str]:
    """'mean Stage-2 reward: ...', 'eval on SET: base A -> ema B (...)', the picture and the next
    commands (`next_steps`); [] for a failed run."""
    if e.reason == "failed":
        return []
    return _changes(e) + next_steps(e)


def next_steps(e: ev.RunFinished) -> list[str]:
    """A finished run's next commands, its folder filled in: score, draw and export its newest checkpoint."""
    if e.reason != "completed" or not e.checkpoint or not e.run_dir:
        return []
    from solrl_core.tools.sources import example_prompt

    record = ev.decode(dict(e.last_eval or e.base_eval)) if (e.last_eval or e.base_eval) else None
    prompt = example_prompt(record.prompts if isinstance(record, ev.EvalFinished) else "")
    run = shlex.quote(e.run_dir)
    return ["  next:", f"    solrl eval {run}", f"    solrl infer {run} --prompt {shlex.quote(prompt)}",
            f"    solrl export {run}"]


def _changes(e: ev.RunFinished) -> list[str]:
    lines = []
    if e.first_reward is not None and e.last3_reward is not None:
        # the iterations last3_reward averages: the run says (never the first); a log older than that field, the last 3
        last = plural(e.last_iterations or max(min(3, e.iteration), 1), "iteration")
        lines.append(f"  mean Stage-2 reward: first iteration {fmt(e.first_reward)}, last {last} {fmt(e.last3_reward)} "
                     f"(change {e.last3_reward - e.first_reward:+.4g})")
    elif e.first_reward is not None:
        lines.append(f"  mean Stage-2 reward: {fmt(e.first_reward)} (one iteration: no change to show yet)")
    if e.base_eval is None or e.last_eval is None:
        return lines + _picture(e.last_eval or e.base_eval)
    a, b = ev.decode(dict(e.base_eval)), ev.decode(dict(e.last_eval))
    if not isinstance(a, ev.EvalFinished) or not isinstance(b, ev.EvalFinished):
        return lines
    se = b.delta_se  # paired standard errors of the changes, when this process holds the base's scores
    line = (f"  eval on {b.prompts}: {a.weights} {fmt(a.mean)} -> {b.weights} {fmt(b.mean)} (iteration {b.iteration}"
            + (f"; change {b.mean - a.mean:+.4f} +- {se['mean']:.4f} s.e." if "mean" in se else "") + ")")
    for key, after in b.extras.items():
        if key in a.extras:
            pm = f" +- {se[key]:.3f}" if key in se else ""
            line += f"; {key.split('.')[-1]} {a.extras[key]:.3f} -> {after:.3f} ({after - a.extras[key]:+.3f}{pm})"
    lines.append(line)
    if b.eval_rewards:
        lines.append(f"  eval rewards (scored, not trained on): {eval_rewards_text(b)}")
    return lines + _picture(e.last_eval)


def _picture(record: dict | None) -> list[str]:
    """'picture: PATH (...)' for the latest evaluation's picture; [] without one."""
    e = ev.decode(dict(record)) if record else None
    if not isinstance(e, ev.EvalFinished) or not e.picture:
        return []
    shows = "the base" if e.weights == "base" else f"base beside {e.weights}, same seeds"
    return [f"  picture: {e.picture} ({shows})"]
