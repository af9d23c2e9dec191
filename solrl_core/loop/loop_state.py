"""What a run's loop advances and a checkpoint saves: the iteration and step counters, the reward
history, the seconds spent (every session's, so a resumed run's end counts the time before its stop), the streaks that
decide a stop (near-constant rewards, non-finite rewards and steps), and each
evaluation's hacking verdict (loop/hacking.py) with the rollbacks made.

Everything else a run holds (config, model, copies, optimizer, rewards) is fixed once
`open_session` returns (session.py); the optimizer's and adapters' tensors are saved beside this
state in the checkpoint folder (checkpoint.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solrl_core.faults.guard import FaultState
from solrl_core.rewards.health import RewardHealth

PENDING = "evaluation_pending"  # in trainer_state.json when true: a resume evaluates before it trains


@dataclass
class LoopState:
    iteration: int = 0  # iterations finished
    step: int = 0  # optimizer steps taken (a skipped step does not count)
    history: list[float] = field(default_factory=list)  # mean final reward per iteration
    health: RewardHealth = field(default_factory=lambda: RewardHealth(min_std=0.0, patience=0))
    faults: FaultState = field(default_factory=FaultState)  # non-finite reward and skipped-step streaks
    resumed: bool = False
    earlier_seconds: float = 0.0  # the seconds of the sessions before this one, up to the checkpoint resumed from
    session_start: float | None = None  # time.perf_counter() when this session's loop began (start_clock)
    explore_steps: int = 0  # Stage 1's preview steps as the last calibration chose them (0: none made; calibration.py)
    explore_precision: str = ""  # Stage 1's precision as the last steps+precision calibration chose it ("": none made)
    # the evaluation due after `iteration` was dropped or skipped by a stop (run_eval.py)
    evaluation_pending: bool = False
    # each evaluation's verdict (hacking.verdict), in order
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    rollbacks: int = 0  # run.on_hacking=rollback: rollbacks made so far (rollback.py)
    # this session: the hacking rule stopped it ("on_hacking=stop", "the last rollback"); not saved
    stopped_by_rule: str = ""

    def start_clock(self) -> None:
        self.session_start = time.perf_counter()

    def session_seconds(self) -> float:
        return time.perf_counter() - self.session_start if self.session_start is not None else 0.0

    def total_seconds(self) -> float:
        """Every session's seconds together: the earlier ones' and this one's so far."""
        return self.earlier_seconds + self.session_seconds()

    def finished(self, iterations: int) -> bool:
        """Every iteration done, and the evaluation due after the last (a stop may have dropped it)."""
        return self.iteration >= iterations and not self.evaluation_pending

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's trainer_state.json."""
        return {"iteration": self.iteration, "step": self.step, "history": self.history,
                "reward_streaks": dict(self.health.streaks), "faults": self.faults.to_dict(),
                "seconds": self.total_seconds(),
                **({"explore_steps": self.explore_steps} if self.explore_steps else {}),
                **({"explore_precision": self.explore_precision} if self.explore_precision else {}),
                **({PENDING: True} if self.evaluation_pending else {}),
                **({"evaluations": self.evaluations} if self.evaluations else {}),
                **({"rollbacks": self.rollbacks} if self.rollbacks else {})}

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint's trainer_state.json (one written before seconds were kept counts none)."""
        self.iteration, self.step, self.history = saved["iteration"], saved["step"], saved["history"]
        self.earlier_seconds = float(saved.get("seconds", 0.0))
        self.health.streaks = dict(saved.get("reward_streaks", {}))
        self.faults = FaultState.from_dict(saved.get("faults"))
        self.explore_steps = int(saved.get("explore_steps", 0))
        self.explore_precision = str(saved.get("explore_precision", ""))
        self.evaluation_pending = saved.get(PENDING) is True
        self.evaluations = list(saved.get("evaluations", []))
        self.rollbacks = int(saved.get("rollbacks", 0))
        self.resumed = True

    def streaks(self) -> tuple[dict[str, int], FaultState]:
        """A copy of what a failed attempt at an iteration may have advanced (see backoff.py)."""
        return dict(self.health.streaks), FaultState.from_dict(self.faults.to_dict())

    def set_streaks(self, saved: tuple[dict[str, int], FaultState]) -> None:
        self.health.streaks, self.faults = saved


def evaluation_pending(checkpoint: Path) -> bool:
    """Whether `checkpoint` was saved with its iteration's evaluation still due (a stop dropped it), read
    before anything loads: a resume of a run at its last iteration is not refused then. A state that
    cannot be read says no here; loading the checkpoint names what is wrong with it."""
    try:
        saved = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and saved.get(PENDING) is True
