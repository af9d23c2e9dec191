"""solrl from Python: the same run `solrl train` starts, for notebooks and scripts.

    from solrl import train

    result = train(model="tiny", family="sol_rl", iterations=30, sets=["run.threads=2"])
    print(result.run_dir, result.iteration, result.finished)

Settings layer as on the command line (defaults < model preset < family preset < reward preset <
`config` file < `sets` < the keyword arguments); every event the run emits (solrl_core/events.py)
is passed to `on_event`, which is where a notebook draws its own progress. Errors are
`solrl_core.errors.SolrlError`s carrying `.message` and `.fix`. Import solrl before torch: it asks
OpenMP's idle threads to sleep (OMP_WAIT_POLICY=PASSIVE, unless set), which only works before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from solrl_core.runtime.threads import prepare_openmp

__all__ = ["RunResult", "train"]

prepare_openmp()  # imported before torch, idle OpenMP threads sleep (solrl_core/runtime/threads.py), as under `solrl train`


@dataclass(frozen=True)
class RunResult:
    """What a call to `train` leaves: where the run is, how far it got, and what it emitted."""

    run_dir: Path
    iteration: int  # iterations finished, counting those before a resume
    finished: bool  # False when a stop (signal, stop_on_*) ended it before run.iterations
    events: list[Any] = field(repr=False)


def train(model: str | None = None, family: str | None = None, reward: str | None = None, *, preset: str | None = None,
          config: str | Path | None = None, sets: Iterable[str] = (), run_dir: str | Path | None = None,
          iterations: int | None = None, seed: int | None = None, device: str | None = None,
          resume: str | Path | None = None, checkpoint: str | None = None, trust_run_config: bool = False,
          on_event: Callable[[Any], None] | None = None) -> RunResult:
    """Train one run in this process (one GPU or the CPU; `solrl train --nproc-per-node N` for more),
    started as `solrl train` starts it (solrl_core/tools/start.py): the same config, and the same
    checks of its inputs and of this machine, said as a SolrlError before any model loads.
    `model` and `family` default to tiny and sol_rl. `resume`: a run folder to continue with the
    config saved there (`sets`, `iterations`, `device` and `reward` may still change what a resume may
    change). A reward plugin or URL reward that folder's config names is refused unless `reward` names
    it again or `trust_run_config=True` (a run folder is data: docs/reliability.md, Threats)."""
    from solrl_core import events
    from solrl_core.tools.start import RunRequest, start_run

    flags = {"run": {"iterations": iterations, "seed": seed, "device": device,
                     "run_dir": str(run_dir) if run_dir else None}}
    start = start_run(RunRequest(model, family, reward, preset, config, tuple(sets), flags,
                                 Path(resume) if resume is not None else None, checkpoint, trust_run_config, api=True))
    bus, seen = events.EventBus(), []
    bus.subscribe(seen.append)
    if on_event is not None:
        bus.subscribe(on_event)
    session = start.train(bus)
    return RunResult(run_dir=Path(session.run.run_dir), iteration=session.state.iteration,
                     finished=session.state.iteration >= session.run.config.run.iterations, events=seen)
