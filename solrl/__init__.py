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


def train(model: str = "tiny", family: str = "sol_rl", reward: str | None = None, *, preset: str | None = None,
          config: str | Path | None = None, sets: Iterable[str] = (), run_dir: str | Path | None = None,
          iterations: int | None = None, seed: int | None = None, device: str | None = None,
          resume: str | Path | None = None, checkpoint: str | None = None, trust_run_config: bool = False,
          on_event: Callable[[Any], None] | None = None) -> RunResult:
    """Train one run in this process (one GPU or the CPU; `solrl train --nproc-per-node N` for more).
    `resume`: a run folder to continue with the config saved there (`sets`, `iterations` and `reward`
    may still change what a resume may change). A reward plugin or URL reward that folder's config
    names is refused unless `reward` names it again or `trust_run_config=True` (a run folder is data:
    docs/reliability.md, Threats)."""
    from solrl_core import events
    from solrl_core.config.presets import resolve_config, resumed_config
    from solrl_core.io.rundir import check_new_run_dir
    from solrl_core.loop.trainer import train as run

    flags = {"run": {"iterations": iterations, "seed": seed, "device": device,
                     "run_dir": str(resume or run_dir) if (resume or run_dir) else None}}
    if resume is not None:
        cfg = resumed_config(resume, sets, flags, reward=reward, trust=trust_run_config, api=True)
    else:
        cfg = resolve_config(model, family, reward, preset, config, sets, flags)
        check_new_run_dir(cfg.run.run_dir)
    bus, seen = events.EventBus(), []
    bus.subscribe(seen.append)
    if on_event is not None:
        bus.subscribe(on_event)
    session = run(cfg, bus, resume=resume is not None, checkpoint=checkpoint)
    return RunResult(run_dir=Path(session.run.run_dir), iteration=session.state.iteration,
                     finished=session.state.iteration >= session.run.config.run.iterations, events=seen)
