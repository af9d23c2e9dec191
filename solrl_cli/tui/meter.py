"""What the TUI header says about the machine: GPU use where there is a GPU, and the training
process's CPU use and resident memory, measured from /proc (Linux) between two readings.

`train --tui` measures its own process; `solrl monitor RUN` measures the process that holds the
run's lock (RUN/solrl.lock names it) when it runs on this machine. No torch, no Textual."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from solrl_core.errors import SolrlError
from solrl_core.faults.links import check_path
from solrl_core.faults.lock import LOCK_FILE


class ProcessMeter:
    """CPU% (100% = one core busy) over the time since the previous reading, and resident memory."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._last: tuple[float, float] | None = None  # (wall seconds, CPU seconds)
        self.cores = os.cpu_count() or 1

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the process, all its threads; None when it cannot be read."""
        if self.pid is None:
            return None
        if self.pid == os.getpid():
            t = os.times()
            return t.user + t.system
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def rss_bytes(self) -> int | None:
        if self.pid is None:
            return None
        try:
            pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return None
        return pages * os.sysconf("SC_PAGE_SIZE")

    def read(self) -> tuple[float | None, int | None]:
        """(CPU percent since the last reading, or None on the first; resident bytes)."""
        now, cpu = time.monotonic(), self.cpu_seconds()
        percent = None
        if cpu is not None and self._last is not None and now > self._last[0]:
            percent = 100 * (cpu - self._last[1]) / (now - self._last[0])
        self._last = (now, cpu) if cpu is not None else None
        return percent, self.rss_bytes()

    def line(self) -> str:
        """'CPU 183% of 2 cores  RSS 1.31 GiB' (the training process), '' when it cannot be measured here."""
        percent, rss = self.read()
        if percent is None and rss is None:
            return ""
        cpu = "CPU ..." if percent is None else f"CPU {percent:.0f}%"
        return f"{cpu} of {self.cores} cores" + (f"  RSS {rss / 2**30:.2f} GiB" if rss is not None else "")


def run_pid(run_dir: str | Path) -> int | None:
    """The process writing `run_dir` (from its lock file) when it runs on this machine, else None."""
    try:
        info = json.loads(check_path(run_dir, LOCK_FILE).read_text(encoding="utf-8"))
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError, SolrlError):  # a planted link or fifo is not read
        return None
    return pid if info.get("host") == socket.gethostname() and Path(f"/proc/{pid}").exists() else None


def gpu_line() -> str:
    """Utilisation and memory of this machine's GPUs, when nvidia-ml-py imports and finds one; '' otherwise."""
    try:
        import pynvml

        pynvml.nvmlInit()
        parts = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            parts.append(f"gpu{i} {pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}% "
                         f"mem {mem.used / 2**30:.1f}/{mem.total / 2**30:.1f} GiB")
    except Exception:  # noqa: BLE001 - not installed, no driver, no device: all mean the same here
        return ""
    return "GPU " + "  ".join(parts) if parts else ""
