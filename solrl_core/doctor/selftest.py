"""`solrl doctor --selftest`: every path solrl would take on this machine, run for real on tiny
random models of the real architectures, before any download.

Each row (selftest_rows.py) runs one path through the code a run takes (`train`, the bench's model
builder, the reward server, export) and reports pass, fail or skipped-with-reason, its seconds, its
peak memory (on CUDA the row's own peak of allocated memory; on a CPU the process's peak resident
size so far, which only grows) and, for a failure, one line with the fix. A failing row does not
stop the others. Which rows run is decided from the device and its compute capability alone
(`choose`), so a test can fake an sm_90 or sm_100 GPU and see the CUDA-only rows chosen.
"""

from __future__ import annotations

import fnmatch
import os
import resource
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from solrl_core.doctor.selftest_base import FAIL, PASS, SKIPPED, Context, Row, RowResult
from solrl_core.errors import SolrlError

__all__ = ["Context", "Row", "RowResult", "choose", "matches", "passed", "run_row", "run_selftest"]

def matches(name: str, only: str | None) -> bool:
    """--only: comma-separated glob patterns; a pattern without a wildcard matches as a substring."""
    if not only:
        return True
    pats = [p.strip() for p in only.split(",") if p.strip()]
    return any(fnmatch.fnmatch(name, p if any(c in p for c in "*?[") else f"*{p}*") for p in pats)


def choose(rows: list[Row], ctx: Context, only: str | None = None) -> list[tuple[Row, str | None]]:
    """The rows --only selects, each with the reason it is skipped here (None: it runs)."""
    chosen = [(row, row.skip(ctx)) for row in rows if matches(row.name, only)]
    if not chosen:
        raise SolrlError(f"--only {only} matches no self-test row", "rows: " + ", ".join(r.name for r in rows))
    return chosen


def memory_label(ctx: Context) -> str:
    return "GPU memory allocated, the row's peak" if ctx.cuda else "the process's peak resident size so far"


def _peak_gib(ctx: Context) -> float | None:
    if ctx.cuda:
        import torch

        return torch.cuda.max_memory_allocated(ctx.device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def run_row(row: Row, reason: str | None, ctx: Context) -> RowResult:
    """One row, its failure caught and said in one line with its fix (the traceback with SOLRL_DEBUG=1)."""
    if reason is not None:
        return RowResult(row.name, SKIPPED, 0.0, None, reason)
    if ctx.cuda:
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    start = time.perf_counter()
    try:
        status, detail, fix = PASS, row.run(ctx), ""
    except SolrlError as exc:
        status, detail, fix = FAIL, exc.message, exc.fix or row.fix
    except Exception as exc:  # noqa: BLE001 - every failure is a row of the table, the others still run
        text = str(exc).strip().splitlines()
        status, detail, fix = FAIL, f"{type(exc).__name__}: {text[0] if text else ''}", row.fix.replace("NAME",
                                                                                                        row.name)
    if status == FAIL and os.environ.get("SOLRL_DEBUG", "") not in ("", "0"):
        traceback.print_exc()
    return RowResult(row.name, status, time.perf_counter() - start, _peak_gib(ctx), detail, fix, memory_label(ctx))


def context(device: str, root: Path, **given: Any) -> Context:
    """The context of this machine's `device` ("auto": the first GPU, else the CPU)."""
    from solrl_core.precision.hardware import gpus
    from solrl_core.runtime.device import resolve_device

    dev = resolve_device(device)
    found = gpus() if dev.type == "cuda" else []
    index = dev.index or 0
    gpu = next((g for g in found if g.index == index), None)
    return Context(f"cuda:{index}" if dev.type == "cuda" else "cpu", gpu, len(found), root, **given)


def run_selftest(device: str = "auto", only: str | None = None, on_start: Callable[[str], None] = lambda name: None,
                 on_row: Callable[[RowResult], None] = lambda result: None, **given: Any) -> list[RowResult]:
    """Every chosen row in turn, in a temporary folder removed after; `on_start` and `on_row` are told
    as each row starts and ends (the progress lines). `given`: Context's sets, reward, precision, export."""
    from solrl_core.doctor.selftest_rows import rows

    with tempfile.TemporaryDirectory(prefix="solrl-selftest-") as tmp:
        ctx = context(device, Path(tmp), **given)
        results = []
        for row, reason in choose(rows(ctx), ctx, only):
            on_start(row.name)
            result = run_row(row, reason, ctx)
            on_row(result)
            results.append(result)
    return results


def passed(results: list[RowResult]) -> bool:
    """Exit 0 only when every row that could run passed (skipped rows are not failures)."""
    return all(r.status != FAIL for r in results)
