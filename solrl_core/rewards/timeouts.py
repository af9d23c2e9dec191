"""How long one scoring call of a reward may take: `reward.timeout_s` read as seconds (torch-free, so
the config's checks use it before torch loads; the watchdog in watchdog.py enforces it)."""

from __future__ import annotations

from solrl_core.errors import SolrlError

MODEL_DEFAULT_S = 600.0  # `auto` for rewards that run a learned model: generous for a batch of 32 on a busy GPU


def parse_timeout(setting: str) -> float | None:
    """reward.timeout_s as seconds; None for `auto`. Raises SolrlError for anything else."""
    text = str(setting).strip().lower()
    if text == "auto":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0 or seconds == float("inf"):
        raise SolrlError(f"reward.timeout_s={setting!r} must be auto or a number of seconds >= 0",
                         "--set reward.timeout_s=600 (0 turns the watchdog off)")
    return seconds


def timeout_for(setting: str, model_reward: bool) -> float:
    """Seconds allowed to one scoring call of a reward (0 = unwatched)."""
    seconds = parse_timeout(setting)
    if seconds is None:
        return MODEL_DEFAULT_S if model_reward else 0.0
    return seconds
