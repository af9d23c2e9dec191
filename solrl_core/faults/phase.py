"""Which phase an out-of-memory error belongs to, named where the phase runs (see backoff.py).

Kept apart from backoff.py, which rewrites the run's config: the rewards, the rollouts and the update
charge their errors here without depending on the config or the run."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

PHASES = ("reward", "update", "evaluation", "rollout")  # each with a batch size backoff.py can halve
_ATTRIBUTE = "solrl_oom_phase"


@contextlib.contextmanager
def charged_to(phase: str) -> Iterator[None]:
    """Charge an out-of-memory error raised inside to `phase`, unless an inner phase already took it."""
    if phase not in PHASES:
        raise ValueError(f"no out-of-memory phase {phase!r}: one of {', '.join(PHASES)}")
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        if getattr(exc, _ATTRIBUTE, None) is None:
            setattr(exc, _ATTRIBUTE, phase)
        raise


def phase_of(exc: BaseException) -> str | None:
    """The phase an out-of-memory error was charged to (None: raised outside every phase)."""
    return getattr(exc, _ATTRIBUTE, None)
