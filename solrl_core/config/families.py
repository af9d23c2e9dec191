"""The algorithm families, one row each: what Stage 1 rolls out, at which precision and step count,
whether Stage 2 regenerates, and which copy of the model the family is defined by. Every rule that
depends on the family reads this table (the plan, the machine's switches, sharding, the config's
checks, the doctor, the terminal UI); the presets/families/*.toml files hold each family's settings.

The paper's families (arXiv 2604.06916, the official configs/sol_rl/*.py):

    sol_rl         N seeds at the explore precision and preview steps, keep K, regenerate them at full precision
    naive_quant    N seeds at the explore precision and full steps, keep K, train on them directly
    compile        N seeds at full precision on a compiled copy, keep K, train on them directly
    naive_scaling  N seeds at full precision, keep K, train on them directly
    diffusionnft   K seeds at full precision, train on all of them
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    explores_pool: bool  # Stage 1 rolls out explore.group_size (N) seeds and keeps K; else K seeds, all kept
    preview_steps: bool  # Stage 1 at explore.steps; else at the full sampler.steps
    low_precision: bool  # Stage 1 at the explore precision (an explore copy); else at the run dtype
    regenerate: bool  # Stage 2 regenerates the kept seeds at full precision and full steps
    copy: str = ""  # the copy the family is defined by: "compiled" (a compiled rollout copy), "quantized" (an explore copy)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("sol_rl", explores_pool=True, preview_steps=True, low_precision=True, regenerate=True),
    Family("naive_scaling", explores_pool=True, preview_steps=False, low_precision=False, regenerate=False),
    Family("compile", explores_pool=True, preview_steps=False, low_precision=False, regenerate=False, copy="compiled"),
    Family("naive_quant", explores_pool=True, preview_steps=False, low_precision=True, regenerate=False, copy="quantized"),
    Family("diffusionnft", explores_pool=False, preview_steps=False, low_precision=False, regenerate=False),
)}


def family(name: str) -> Family:
    """The family called `name` (config.validate has checked it is one)."""
    return FAMILIES[name]
