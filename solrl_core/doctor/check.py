"""What one doctor check reports, and the facts about this machine the checks share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from solrl_core.precision import hardware
from solrl_core.precision.hardware import GpuInfo

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""
    needed_by_run: bool = False

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Machine:
    gpus: list[GpuInfo]
    te: hardware.TEStatus
    offline: bool
    cache: Path


def machine() -> Machine:
    from huggingface_hub import constants

    return Machine(hardware.gpus(), hardware.transformer_engine_status(),
                   bool(constants.HF_HUB_OFFLINE), Path(constants.HF_HUB_CACHE))
