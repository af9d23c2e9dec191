"""benchmarks/carry_list.py: the wheels a lent GPU machine needs, walked offline through the installed
distributions' Requires-Dist, and docs/gpu-lease.md's download command listing every one of them (a
wheel left off it made fastapi unimportable there, and the self-test's reward-server row failed)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import BENCHMARKS

DOCS = BENCHMARKS.parent / "docs" / "gpu-lease.md"


@pytest.fixture
def carry(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("carry_list", None)
    import carry_list
    return carry_list


def _documented() -> dict[str, str]:
    block = DOCS.read_text().split("python benchmarks/carry_list.py\n", 1)[1].split("```", 1)[0]
    return {name.lower(): version for name, version in re.findall(r"([A-Za-z0-9_.-]+)==([^\s\\]+)", block)}


def test_the_docs_download_command_names_every_distribution_a_lease_needs(carry):
    needed = carry.carry_list(carry.MACHINE_HAS)
    missing = sorted(set(needed) - set(_documented()))
    assert not missing, (f"docs/gpu-lease.md's carry list lacks {missing}: paste `python benchmarks/carry_list.py`'s "
                         f"output there")


def test_the_walk_follows_requires_dist_and_extras_and_leaves_the_machines_packages(carry):
    from packaging.requirements import Requirement

    needed = carry.carry_list(carry.MACHINE_HAS, [Requirement("fastapi"), Requirement("textual")])
    assert {"fastapi", "starlette", "pydantic", "pydantic-core", "textual", "mdit-py-plugins"} <= set(needed)
    assert "linkify-it-py" in needed  # textual asks for markdown-it-py[linkify]: the extra's requirements are walked
    assert not set(needed) & {"torch", "typer", "rich", "numpy"}  # the machine's, and what torch brings
    assert "typing-extensions" in needed  # the machine has one, but pydantic needs a newer minor than its
    root = carry.roots()
    # the lease extra, solrl[server] expanded
    assert {"fastapi", "uvicorn", "pytest", "torchao"} <= {r.name for r in root}


def test_the_machines_packages_come_from_its_baseline(carry, tmp_path):
    baseline = tmp_path / "BASELINE.md"
    baseline.write_text("## Setting up\nIts Python (3.12) has torch, transformers, peft, typer, rich and\nmatplotlib, "
                        "but not diffusers, textual, tomli-w or torchao. Carry their wheels.\n")
    assert carry.machine_has(baseline) == carry.MACHINE_HAS
    assert carry.machine_has(tmp_path / "absent.md") == carry.MACHINE_HAS
