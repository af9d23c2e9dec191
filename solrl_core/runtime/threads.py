"""CPU threads for torch: what `run.threads` = 0 (auto) chooses, and the OpenMP wait policy.

torch's CPU kernels run on an OpenMP thread pool (libgomp in the pip wheels). Left at libgomp's
default, a thread that finishes its share of a parallel region spins (about 300,000 turns, a few
milliseconds) waiting for the next one. Alone on the machine that costs nothing; when another
process wants the same cores, the spinning threads take CPU from the one thread every region waits
for, and two tiny-world iterations on a shared 2-core CPU took 286 s instead of 14 s with idle
threads asleep (docs/BENCHMARKS.md). So:

- `prepare_openmp` sets OMP_WAIT_POLICY=PASSIVE (idle threads sleep at once) unless the user set
  OMP_WAIT_POLICY or GOMP_SPINCOUNT. libgomp reads it once, when torch loads it, so `solrl` calls
  this first thing, before anything imports torch (solrl_cli/app.py); torchrun's workers inherit it.
  A Python program that imports torch itself must set the variable before its own `import torch`.
- auto takes one thread per core this process may run on (its CPU affinity, capped by a cgroup CPU
  quota), divided among the processes torchrun started on this node (LOCAL_WORLD_SIZE), at least
  one each. A single process honours OMP_NUM_THREADS when the user set it (under torchrun the
  launcher sets it to 1 itself, so it says nothing there). A number in `run.threads` is used as given.

Nothing here imports torch at module level: the launcher and the CLI use it before torch loads.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, MutableMapping

PASSIVE = "PASSIVE"
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    why: str

    def describe(self, environ: Mapping[str, str] = os.environ) -> str:
        """'torch threads 2 (auto: ...); OpenMP idle threads sleep (OMP_WAIT_POLICY=PASSIVE)', for the start-up line."""
        policy = environ.get("OMP_WAIT_POLICY")
        if policy is not None:
            wait = f"OMP_WAIT_POLICY={policy}"
        elif "GOMP_SPINCOUNT" in environ:
            wait = f"GOMP_SPINCOUNT={environ['GOMP_SPINCOUNT']}"
        else:
            wait = "libgomp's default wait: idle threads spin"
        return f"torch threads {self.threads} ({self.why}); {wait}"


def prepare_openmp(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Ask for sleeping idle OpenMP threads before torch loads libgomp. False when it is too late
    (torch already imported) or the user chose a wait policy or spin count of their own."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["OMP_WAIT_POLICY"] = PASSIVE
    return True


def cgroup_cores(root: Path = CGROUP) -> float | None:
    """The CPU quota of this container in cores (cgroup v2 cpu.max or v1 cfs quota), None when unlimited."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, *period = v2.read_text().split()
            if quota == "max":
                return None
            return int(quota) / int(period[0] if period else 100000)
        v1 = root / "cpu" / "cpu.cfs_quota_us"
        if v1.is_file():
            quota_us = int(v1.read_text())
            if quota_us <= 0:
                return None
            return quota_us / int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


def usable_cores(root: Path = CGROUP) -> int:
    """Cores this process may run on: its CPU affinity (taskset, Slurm, a container's cpuset), capped
    by a cgroup CPU quota rounded up; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cores(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def choose_threads(setting: int, cores: int, processes: int = 1, omp_num_threads: str | None = None) -> ThreadChoice:
    """What torch gets for `run.threads` = `setting` with `cores` usable cores shared by `processes`
    processes on this node (torchrun's LOCAL_WORLD_SIZE); `omp_num_threads` is the user's
    OMP_NUM_THREADS, read only when there is one process."""
    if setting > 0:
        over = (f"; more than the {cores} core{'s' if cores != 1 else ''} this process may use" if setting
                * processes > cores else "")
        return ThreadChoice(setting, f"run.threads={setting}{over}")
    if processes == 1 and omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
        return ThreadChoice(int(omp_num_threads), f"auto: OMP_NUM_THREADS={int(omp_num_threads)}")
    if processes <= 1:
        return ThreadChoice(cores, f"auto: one per core this process may use, {cores}")
    each = max(1, cores // processes)
    return ThreadChoice(each, f"auto: {cores} core{'s' if cores != 1 else ''} shared by {processes} processes on this "
                              f"node, {'at least 1' if cores < processes else each} each")


def apply_threads(setting: int, environ: Mapping[str, str] = os.environ) -> ThreadChoice:
    """Choose the thread count for `run.threads` = `setting` here and give it to torch (its OpenMP,
    MKL and oneDNN pools)."""
    import torch

    processes = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    choice = choose_threads(setting, usable_cores(), processes, environ.get("OMP_NUM_THREADS"))
    torch.set_num_threads(choice.threads)
    return choice


def launch_note(nproc: int, device: str, setting: int = 0) -> str | None:
    """What `solrl train --nproc-per-node nproc` costs when `device` (run.device) is this CPU and
    run.threads is `setting`; None on a GPU."""
    if device.startswith("cuda"):
        return None
    if device == "auto":
        import torch

        if torch.cuda.is_available():
            return None
    return oversubscription(nproc, usable_cores(), setting)


def oversubscription(nproc: int, cores: int, setting: int = 0) -> str | None:
    """One line on what --nproc-per-node `nproc` costs on a CPU with `cores` usable cores and
    run.threads = `setting`; None when every process gets a core of its own."""
    if nproc <= cores:
        return None
    share, threads = cores / nproc, choose_threads(setting, cores, nproc).threads
    return (f"note: --nproc-per-node {nproc} on a CPU with {cores} usable core{'s' if cores != 1 else ''}: the "
            f"processes share {'them' if cores != 1 else 'it'}, {share:.2g} of a core and {threads} torch "
            f"thread{'s' if threads != 1 else ''} each, each with its own copy of the model; at most {cores} run at "
            f"once: this exercises the distributed code, not speed (one process with run.threads=0 already uses every "
            f"core; docs/speed-and-memory.md)")
