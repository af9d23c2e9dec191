"""Shared fixtures: a tiny, fast config for loop tests (CPU, no network)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# A cache of our own for the whole session and its subprocesses: a prompt set a user's machine once
# downloaded (~/.cache/solrl/prompts) must not let a test pass there that fails on a fresh machine.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="solrl-test-cache-")

# Four tiny-world captions, one per kind: the tiny preset's own evaluation set (244 captions) would add
# about 20 s to every run on 2 CPU cores.
EVAL_SMALL = Path(__file__).resolve().parent / "data" / "eval_small.txt"

# Small enough that one iteration takes well under a second on 2 CPU cores.
FAST = (
    "explore.group_size=8", "selection.group_size=4", "explore.steps=2", "sampler.steps=4",
    "run.prompts_per_iteration=2", "sampler.rollout_batch=16", "optimizer.micro_batch=8",
    "algorithm.timestep_fraction=0.5", "run.checkpoint_every=100", "run.threads=2", "run.eval_seeds=1",
    f"run.eval_prompts={EVAL_SMALL}",
)


@pytest.fixture
def fast_sets(tmp_path):
    """--set overrides for a quick tiny run writing into a fresh run dir."""
    def make(*extra: str, run_dir: str = "run") -> list[str]:
        return [*FAST, f"run.run_dir={tmp_path / run_dir}", *extra]
    return make


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmark_module(monkeypatch):
    """Import a script of benchmarks/ fresh, as `python benchmarks/NAME.py` would find its imports."""
    def load(name: str):  # type: ignore[no-untyped-def]
        pytest.importorskip("diffusers")
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        sys.modules.pop(name, None)
        return __import__(name)
    return load


def pytest_collection_modifyitems(config, items):
    """Tests marked slow are skipped unless SOLRL_SLOW=1 (CI sets it: .ci/run). By the marker, not by
    keyword: a test or parameter id that merely contains the word "slow" is not skipped."""
    if os.environ.get("SOLRL_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set SOLRL_SLOW=1 to run")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
