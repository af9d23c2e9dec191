"""`solrl doctor`'s memory-mode table: for each model preset, the memory mode (memory_modes.LADDER) it
needs for the sol_rl family on one GPU of each size in memory_modes.GPU_SIZES, by the memory ESTIMATE
(footprint.py: approximate, never measured here), at the dtype and explore precision the preset's plan
takes on a GPU of compute capability 9.0 (auto: bf16 and an fp8 explore copy) and each preset's own
micro-batch."""

from __future__ import annotations

from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import PASS, WARN, Check
from solrl_core.doctor.memory import ASSUMED_GPU, planned
from solrl_core.errors import SolrlError
from solrl_core.plan.memory_modes import GPU_SIZES, rung_needed
from solrl_core.plan.plan import MemoryModes


def mode_table(models: list[str]) -> dict[str, dict[int, MemoryModes | None]]:
    """{model preset: {GPU GB: the rung it needs (None: none fits)}} for sol_rl, by the estimate."""
    from solrl_core.config.presets import resolve_config

    table: dict[str, dict[int, MemoryModes | None]] = {}
    for name in models:
        try:
            cfg = resolve_config(name, "sol_rl")
        except SolrlError:  # a preset this install cannot resolve is left out, not guessed at
            continue
        if cfg.model.loader not in TINY_LOADERS:
            run = planned(cfg, ASSUMED_GPU)
            table[name] = {gb: rung_needed(cfg, run.machine.explore_precision, run.full_precision, gb)
                           for gb in GPU_SIZES}
    return table


def modes_check(cfg: Config, every: bool = False) -> Check | None:
    """The table as one check (informational: the run does not depend on it): the run's own model, or
    (`every`, doctor --memory-modes) every model preset, the run's own first. None for a tiny model
    without `every`: it fits anywhere, and the other presets' rows are a wall of text on a CPU."""
    from solrl_core.config.presets import names

    if not every and cfg.model.loader in TINY_LOADERS:
        return None
    models = sorted(names("models"), key=lambda n: (n != cfg.model.name, n)) if every else [cfg.model.name]
    rows = [f"{name}: "
            + "; ".join(f"{gb} GB: {rung.describe() if rung else 'does not fit'}" for gb, rung in sizes.items())
            for name, sizes in mode_table(models).items()]
    detail = ("the memory mode each model preset needs for sol_rl on one GPU, by the memory ESTIMATE (approximate; "
              "bf16, an fp8 explore copy, the preset's micro-batch; the first rung of the ladder that fits: none, then "
              "the VAE on the CPU, gradient checkpointing, the copies on the CPU moved whole, then block by "
              "block)\n" + "\n".join(rows))
    mine = mode_table([cfg.model.name]).get(cfg.model.name, {})
    if mine and all(rung is None for rung in mine.values()):
        return Check("memory modes", WARN, detail, f"{cfg.model.name} fits none of these sizes on one GPU by the "
                                                   f"estimate: "
                                                   "shard it over several (--nproc-per-node N)")
    return Check("memory modes", PASS, detail)
