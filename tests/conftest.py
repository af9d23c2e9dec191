"""Shared fixtures: a tiny, fast config for loop tests (CPU, no network)."""

from __future__ import annotations

import pytest

# Small enough that one iteration takes well under a second on 2 CPU cores.
FAST = (
    "explore.group_size=8", "selection.group_size=4", "explore.steps=2", "sampler.steps=4",
    "run.prompts_per_iteration=2", "sampler.rollout_batch=16", "optimizer.micro_batch=8",
    "algorithm.timestep_fraction=0.5", "run.checkpoint_every=100", "run.threads=2",
)


@pytest.fixture
def fast_sets(tmp_path):
    """--set overrides for a quick tiny run writing into a fresh run dir."""
    def make(*extra: str, run_dir: str = "run") -> list[str]:
        return [*FAST, f"run.run_dir={tmp_path / run_dir}", *extra]
    return make
