"""The base of one experiment tracker: metrics go to `scalars`, sample grids to `image`."""

from __future__ import annotations

from solrl_core import events as ev
from solrl_core.tracking import metrics


class Tracker:
    """Base of one tracker: metrics go to `scalars`, sample grids to `image`."""

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.SampleGrid):
            self.image(event)
            return
        found = metrics.scalars(event)
        if found is not None and found[1]:
            self.scalars(*found)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def image(self, grid: ev.SampleGrid) -> None:
        raise NotImplementedError

    def close(self, reason: str) -> None:
        raise NotImplementedError


def caption(grid: ev.SampleGrid) -> str:
    """The prompt, the rewards and the seeds of a sample grid, left to right."""
    rewards = ", ".join(f"{r:.4g}" for r in grid.rewards)
    seeds = f"; seeds {', '.join(str(s) for s in grid.seeds)}" if grid.seeds else ""
    return f"{grid.prompt} (Stage-2 rewards, best first: {rewards}{seeds})"
