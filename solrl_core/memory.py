"""Peak memory of each phase of an iteration, as measured: on CUDA the device's peak allocated bytes
since the phase began (torch's allocator statistics); on a CPU the process's peak resident set so
far (getrusage), which only grows, so a phase's figure is the peak up to its end."""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Iterator

import torch

GIB = 2**30


class PhaseMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.source = "cuda peak allocated" if self.cuda else "process peak RSS"
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            self.peaks[name] = max(self.peaks.get(name, 0.0), self._peak())

    def _peak(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / GIB
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB
