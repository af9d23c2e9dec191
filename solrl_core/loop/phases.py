"""One recorder of an iteration's phases: the wall time of each and, for those that hold tensors,
its peak memory as measured: on CUDA the device's peak allocated bytes since the phase began
(torch's allocator statistics); on a CPU the process's peak resident set so far (getrusage), which
only grows, so a phase's figure is the peak up to its end.

Times are synchronized with the GPU where a phase ends, so a phase's time is its own."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from typing import Callable, Iterator

import torch

from solrl_core.runtime import distributed

GIB = 2**30


class PhaseRecorder:
    def __init__(self, device: torch.device, on_enter: Callable[[str], None] | None = None) -> None:
        self.device = device
        self.on_enter = on_enter  # told each phase's name as it begins (a stop at the next phase boundary)
        self.cuda = device.type == "cuda"
        self.source = "cuda peak allocated" if self.cuda else "process peak RSS"
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, memory: bool = True) -> Iterator[None]:
        """Time the block as `name` (added up over repeats) and, with `memory`, record its peak."""
        if self.on_enter is not None:
            self.on_enter(name)
        if memory and self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            if memory:
                self.peaks[name] = max(self.peaks.get(name, 0.0), self._peak())

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def slowest_rank(self, seconds: dict[str, float], peaks: dict[str, float]) -> tuple[dict[str, float],
                                                                                        dict[str, float]]:
        """Each phase as long (and as large) as on its slowest rank (itself, with one process)."""
        if distributed.world_size() == 1:
            return seconds, peaks
        values = distributed.all_reduce(torch.tensor([*seconds.values(), *peaks.values()], dtype=torch.float64),
                                        "max").tolist()
        return dict(zip(seconds, values)), dict(zip(peaks, values[len(seconds):]))

    def _peak(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / GIB
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB
