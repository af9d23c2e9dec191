"""What a row of `solrl doctor --selftest` is (selftest.py runs them, selftest_rows.py declares them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from solrl_core.precision.hardware import GpuInfo

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass
class Context:
    """What the rows share: where they run, what the user asked for, and the pipelines built so far."""

    device: str  # "cpu" or "cuda:N"
    gpu: GpuInfo | None
    gpu_count: int
    root: Path
    sets: tuple[str, ...] = ()  # --set overrides applied to every row's run
    reward: str | None = None  # --reward: one more row trains on it
    precision: str | None = None  # --explore-precision: that row runs even where the machine lacks it
    # `solrl export`'s function (tools/ is a layer above the doctor): None skips the export row
    export: Callable[..., Any] | None = None
    # why torchao's NVFP4 cannot run ('' when it can), standing in for this machine's: tests
    torchao_missing: Any = None
    built: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class Row:
    name: str
    run: Callable[[Context], str]  # does the work; returns what it showed
    skip: Callable[[Context], str | None] = lambda ctx: None  # why it cannot run here, or None
    fix: str = "run it alone with SOLRL_DEBUG=1 to see the traceback: `solrl doctor --selftest --only NAME`"


@dataclass(frozen=True)
class RowResult:
    name: str
    status: str  # pass | fail | skipped
    seconds: float
    peak_gib: float | None
    detail: str
    fix: str = ""
    peak_of: str = ""  # what peak_gib measures (memory_label)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
