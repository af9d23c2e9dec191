"""The algorithm families, one row each: what Stage 1 rolls out, at which precision and step count,
whether Stage 2 regenerates, and which copy of the model Stage 1 rolls out on. The run's plan
(plan/plan.py `plan_stages`) reads this table, and every rule that depends on the family reads the
plan; only the config's own checks read the table besides. The presets/families/*.toml files hold
each family's settings.

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
    regenerate: bool  # Stage 2 regenerates the kept seeds at full precision and full steps
    # the copy Stage 1 rolls out on: "quantized", an explore copy at the explore precision; "compiled", a
    # compiled full-precision rollout copy, kept whatever the memory estimate says; "", the rollout network
    copy: str = ""

    @property
    def low_precision(self) -> bool:
        """Stage 1 at the explore precision (on a quantized explore copy); else at the run dtype."""
        return self.copy == "quantized"


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("sol_rl", explores_pool=True, preview_steps=True, regenerate=True, copy="quantized"),
    Family("naive_scaling", explores_pool=True, preview_steps=False, regenerate=False),
    Family("compile", explores_pool=True, preview_steps=False, regenerate=False, copy="compiled"),
    Family("naive_quant", explores_pool=True, preview_steps=False, regenerate=False, copy="quantized"),
    Family("diffusionnft", explores_pool=False, preview_steps=False, regenerate=False),
)}


def family(name: str) -> Family:
    """The family called `name` (config.validate has checked it is one)."""
    return FAMILIES[name]
