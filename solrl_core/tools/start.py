"""The one front door of a training run: `solrl train` (solrl_cli/train_cmd.py) and `solrl.train()`
(solrl/__init__.py) both start a run here, so it is resolved and checked the same way whichever door
it came through, and a mistake is said in one line before any model loads:

    resolve   the config: a fresh run's (defaults < presets < config file < --set < flags), in a run
              folder that holds no run yet; or, resuming, the one saved in the run's folder with the
              few overrides a resume may make (config/presets.py: resumed_config)
    check     the run's own inputs, in seconds (config/run_inputs.py), then the trackers it logs to
              and the doctor's checks it depends on (doctor/), before anything big loads
    plan      the run's plan for its real world size (loop/session.py: plan_run), once: the doctor's
              checks read it, and the session takes it with the validated config and the prompts read
              here (`Checked`), so a start validates, reads each prompt file and plans once
    launch    one process: `RunStart.train`, here; several (--nproc-per-node, --nnodes): the CLI
              starts them through torchrun (solrl_cli/launch.py), and each comes in again by this door

Every import but the config's is made where it is used: a config error is answered before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError

if TYPE_CHECKING:
    from solrl_core.loop.session import Checked
    from solrl_core.plan.plan import RunPlan

# What a resume may change besides --set and --reward: the rest is fixed by the run's checkpoints
# (config/convert.py: check_resume_overrides) or names the run (its folder, its presets).
RESUMABLE = frozenset({"run.iterations", "run.device", "run.log", "model.path"})


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for: the choices of a fresh run, or the folder of one to resume, and the
    overrides, layered as `solrl train` layers them."""

    model: str | None = None  # a model preset; None: tiny
    family: str | None = None  # None: sol_rl
    reward: str | None = None
    preset: str | None = None
    config: str | Path | None = None  # a config file
    sets: tuple[str, ...] = ()  # section.key=value
    flags: dict[str, dict[str, Any]] = field(default_factory=dict)  # section -> key -> value (None: not given)
    resume: Path | None = None  # the folder of the run to continue
    checkpoint: str | None = None  # with resume: the checkpoint to continue from (None: the newest)
    trust_run_config: bool = False
    processes: int = 1  # per node (--nproc-per-node)
    nodes: int = 1
    api: bool = False  # asked from Python: a fix names its keyword arguments rather than the CLI's flags


@dataclass(frozen=True)
class RunStart:
    """A run resolved and checked, and how it launches."""

    request: RunRequest
    config: Config
    torchrun: bool  # several processes: the caller starts them through torchrun
    note: str  # to say before they start ('' for none): more processes than this CPU has cores
    checked: Checked | None = None  # loop/session.py: the plan resolved and the prompts read here, for the session

    def train(self, bus: Any, stop: Any = None) -> Any:
        """Train (or continue) the run in this process, emitting on `bus`; `stop`: a StopFlag the
        caller owns (the TUI's), else Ctrl-C and SIGTERM stop it. Returns the trainer's Session."""
        if self.torchrun:
            raise SolrlError("a run of several processes starts through torchrun, not in this process",
                             "use `solrl train --nproc-per-node N`")
        from solrl_core.loop.trainer import train

        return train(self.config, bus, resume=self.request.resume is not None, stop=stop,
                     checkpoint=self.request.checkpoint, checked=self.checked)


def start_run(request: RunRequest) -> RunStart:
    """Everything before the first model loads: resolve the run, check its inputs, plan it and check
    this machine, and decide how it launches. Raises the first SolrlError."""
    from solrl_core.config.run_inputs import check_inputs
    from solrl_core.runtime.threads import launch_note

    cfg = resolve(request)  # validated, once
    prompts = check_inputs(cfg, resumed_from=request.resume, api=request.api)  # seconds: before the doctor's imports
    from solrl_core.loop.session import Checked, plan_run  # torch: only once the inputs are accepted

    checked = Checked(plan_run(cfg, world_size(request)), prompts)
    preflight(cfg, request.processes, checked)
    several = request.processes > 1 or request.nodes > 1
    notes = ([launch_note(request.processes, cfg.run.device, cfg.run.threads), parting_note(checked.plan)]
             if several else [])
    return RunStart(request, cfg, several, "\n".join(n for n in notes if n), checked)


def world_size(request: RunRequest) -> int:
    """The processes the run trains in: those this request starts through torchrun, or, in a process
    torchrun started (which comes in by this door again), torchrun's WORLD_SIZE."""
    import os

    return max(request.processes * request.nodes, int(os.environ.get("WORLD_SIZE", "1") or 1))


def parting_note(plan: RunPlan) -> str | None:
    """Where several processes do not train one process's run seed for seed: Stage 1 on a quantized
    copy, as the run's plan (plan/plan.py RunPlan) runs it. Its batches never mix prompt groups
    (Sampler.generate), so the first iteration is the same; after a step the gradient all-reduce rounds
    otherwise than one process's sum, and re-quantizing the merged weights can move a weight lying on a
    rounding tie to the next code."""
    from solrl_core.precision.hardware import FULL_PRECISIONS

    if not plan.low_precision or plan.explore_precision in FULL_PRECISIONS:  # e.g. auto below cc 8.9: bf16
        return None
    return (f"note: several processes train what one process does in iteration 1; after it, the explore copy at "
            f"{plan.explore_precision} can part them by a draft now and then (the gradient all-reduce rounds "
            "differently, and re-quantized weights on a rounding tie take the next code): the same statistics, "
            "not the same seeds (at --explore-precision bf16 or fp32 the runs stay within float rounding of each "
            "other)")


def resolve(request: RunRequest) -> Config:
    """The run's config: with a resume, the one saved in its folder and the overrides a resume may
    make; else a fresh one, whose run folder must not hold a run already."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.io.rundir import check_new_run_dir

    if request.resume is not None:
        return _resumed(request)
    cfg = resolve_config(request.model, request.family, request.reward, request.preset,
                         request.config, request.sets, request.flags)
    check_new_run_dir(cfg.run.run_dir)
    return cfg


def _resumed(request: RunRequest) -> Config:
    """The config saved in the resumed folder, refusing what a resume may not change (--reward names
    its rewards again: config/trust.py)."""
    from solrl_core.config.presets import resumed_config

    given = {f"{section}.{key}" for section, values in request.flags.items() for key, v in values.items()
             if v is not None}
    if any((request.model, request.family, request.preset, request.config)) or given - RESUMABLE:
        if request.api:
            raise SolrlError("resume continues a run with the config saved in its folder",
                             "only iterations, device, reward, trust_run_config and sets may be given with resume")
        raise SolrlError("--resume continues a run with the config saved in its folder",
                         "only --iterations, --device, --log, --model-path, --reward, --trust-run-config and --set "
                         "may be given with --resume")
    flags = {section: dict(values) for section, values in request.flags.items()}
    flags["run"] = {**flags.get("run", {}), "run_dir": str(request.resume)}
    if request.checkpoint is not None:  # a name the run does not hold: said before torch loads
        from solrl_core.io.rundir import check_run_folder, list_checkpoints, pick_checkpoint

        pick_checkpoint(request.resume, list_checkpoints(check_run_folder(request.resume)), request.checkpoint)
    return resumed_config(request.resume, request.sets, flags, reward=request.reward, trust=request.trust_run_config,
                          api=request.api)


def preflight(cfg: Config, processes: int, checked: Checked) -> None:
    """The trackers the run logs to, and the doctor's checks it depends on, before anything big
    loads, on the run's own plan and the prompts it read (`checked`). The memory figure is an
    estimate, so it never blocks a run (`solrl doctor` shows it)."""
    from solrl_core.doctor import failed_for_run, run_checks
    from solrl_core.tracking import require

    require(cfg.run.log)
    checks = run_checks(cfg, processes, only_needed=True, plan=checked.plan, prompts=checked.prompts)
    failed = [c for c in failed_for_run(checks) if c.name != "memory estimate"]
    failed.sort(key=lambda c: c.name != "explore precision")  # the root cause when TE rows fail with it
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more: `solrl doctor` lists them)" if len(failed) > 1 else ""
        raise SolrlError(f"{first.name}: {first.detail}{more}", first.fix or "run `solrl doctor` for details")
