"""The family table (families.py) is the one place a family's stages are defined: every shipped
family preset has a row, and the plan each row gives is the paper's."""

from pathlib import Path

import pytest

from solrl_core.config.families import FAMILIES
from solrl_core.config.presets import resolve_config
from solrl_core.plan.plan import plan_stages

ROOT = Path(__file__).resolve().parents[1]

# (explore seeds, explore steps, explore precision, keep, regenerate) with N=16, K=8, 6 preview
# steps of 10, explore precision fp8 and run dtype bf16: the families of arXiv 2604.06916.
EXPECTED = {
    "sol_rl": (16, 6, "fp8", 8, True),
    "naive_quant": (16, 10, "fp8", 8, False),
    "compile": (16, 10, "bf16", 8, False),
    "naive_scaling": (16, 10, "bf16", 8, False),
    "diffusionnft": (8, 10, "bf16", 8, False),
}


def test_every_family_preset_has_a_row_and_every_row_a_preset():
    presets = {p.stem for p in (ROOT / "presets" / "families").glob("*.toml")}
    assert presets == set(FAMILIES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_plans_the_papers_stages(name):
    cfg = resolve_config("tiny", name, sets=["explore.group_size=16", "selection.group_size=8", "explore.steps=6",
                                             "sampler.steps=10"])
    plan = plan_stages(cfg, "bf16", "fp8")
    assert (plan.explore_seeds, plan.explore_steps, plan.explore_precision, plan.keep,
            plan.regenerate) == EXPECTED[name]
    assert plan.explores_low == FAMILIES[name].low_precision


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_copy_a_row_names_is_what_the_plan_explores_on(name):
    """A row's `copy` is read: "quantized" puts Stage 1 on an explore copy at the explore precision,
    "compiled" keeps a compiled full-precision copy whatever the memory estimate says; the plan holds both."""
    cfg = resolve_config("tiny", name)
    plan = plan_stages(cfg, "bf16", "fp8")
    assert FAMILIES[name].copy in ("quantized", "compiled", "")
    assert plan.low_precision == (FAMILIES[name].copy == "quantized") == (name in ("sol_rl", "naive_quant"))
    assert plan.compiled_copy == (FAMILIES[name].copy == "compiled") == (name == "compile")
