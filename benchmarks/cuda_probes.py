"""Every CUDA call solrl makes that no GPU has run yet, each probed once in a subprocess of its own
under its own time limit, its outcome recorded: what it returned, or the exception's class and
message. The first step of a lease (benchmarks/lease.py): a call that fails here fails in seconds,
with its message, instead of minutes into a measurement.

    python benchmarks/cuda_probes.py --json probes.json            # on the lent GPU (--device auto)
    python benchmarks/cuda_probes.py --device cpu --json probes.json  # the same code on a CPU

The probes, in order of what they unblock:
    e5m2_x_e5m2         torch._scaled_mm on two E5M2 operands (fp8-e5m2-delayed's GEMM), and solrl's
                        probe of it (e5m2_delayed.e5m2_gemm_runs), which must answer, not raise
    fp8_rowwise         solrl's fp8 GEMM (precision/fp8.py): row-wise scaled torch._scaled_mm, against bf16
    torchao_float8      torchao's Float8Tensor PerRow linear (explore.fp8_backend=torchao), eager
    torchao_nvfp4       real NVFP4 (torchao NVFP4Tensor, float4 _scaled_mm): compute capability >= 10.0
    fa3_fp8_attention   explore.fp8_attention: torchao's FP8 FA3 on compute capability 9.x (the emulation on a CPU)
    transformer_engine  whether Transformer Engine's PyTorch part imports (the official recipe's library)
    torchao_float8_compiled  the torchao fp8 linear under torch.compile (mode default), last: it compiles

A probe's status: `ran` (its result), `raised` (the exception recorded: an answer, not a failure),
`skipped` (not for this device, with why), `timed out`, or `crashed` (no record). The JSON is
rewritten after each probe. Exit 1 when a probe timed out, crashed, or raised an error of the probe's
own code (NameError, AttributeError, TypeError, ImportError of solrl): CI runs this on a CPU to catch those.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

PROBES: dict[str, int] = {  # name -> its own time limit, seconds (a cold GPU machine: torch's import included)
    "e5m2_x_e5m2": 12, "fp8_rowwise": 12, "torchao_float8": 15, "torchao_nvfp4": 15, "fa3_fp8_attention": 15,
    "transformer_engine": 8, "torchao_float8_compiled": 35,
}
CODE_ERRORS = ("NameError", "AttributeError", "TypeError", "SyntaxError", "UnboundLocalError")


def _rel_error(got: Any, want: Any) -> float:
    from solrl_core.bench.explore import relative_error

    return relative_error(got, want.float())


def e5m2_x_e5m2(device: Any) -> dict[str, Any]:
    import torch

    from solrl_core.precision.e5m2_delayed import e5m2_gemm_runs

    out: dict[str, Any] = {"solrl_probe_says": e5m2_gemm_runs(device)}  # must answer: a raise here is the crash
    a = torch.zeros(16, 16, device=device).to(torch.float8_e5m2)
    one = torch.ones(1, 1, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        out["scaled_mm"] = "ran"
    except Exception as exc:  # noqa: BLE001 - torch's refusal is the answer recorded
        out["scaled_mm"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return out


def _layer(device: Any, dtype: Any, n: int = 256) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(n, n).to(device, dtype), torch.randn(32, n, device=device, dtype=dtype)


def fp8_rowwise(device: Any) -> dict[str, Any]:
    import torch

    from solrl_core.precision import fp8

    layer, x = _layer(device, torch.bfloat16)
    rowwise = fp8.rowwise_supported(device)
    w_q, w_scale = fp8.quantize(layer.weight.detach(), rowwise)
    y = fp8.linear(x, w_q, w_scale.reshape(1, -1).contiguous(), layer.bias, rowwise)
    return {"rowwise": rowwise, "rel_error_vs_bf16": _rel_error(y, layer(x).detach())}


def torchao_float8(device: Any) -> dict[str, Any]:
    import torch

    from solrl_core.precision.backends import TorchaoFp8Linear

    layer, x = _layer(device, torch.bfloat16)
    with torch.no_grad():
        return {"rel_error_vs_bf16": _rel_error(TorchaoFp8Linear(layer)(x), layer(x))}


def torchao_float8_compiled(device: Any) -> dict[str, Any]:
    import torch

    from solrl_core.precision.backends import TorchaoFp8Linear

    layer, x = _layer(device, torch.bfloat16)
    compiled = torch.compile(TorchaoFp8Linear(layer), mode="default")
    start = time.monotonic()
    with torch.no_grad():
        y = compiled(x)
        first = time.monotonic() - start
        return {"first_call_seconds": first, "rel_error_vs_bf16": _rel_error(y, layer(x))}


def torchao_nvfp4(device: Any) -> dict[str, Any] | str:
    import torch

    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (10, 0):
        return ("real NVFP4 needs compute capability >= 10.0 (tests/test_backends.py checks it on a CPU with a "
                "stand-in kernel)")
    from solrl_core.precision.backends import Nvfp4Linear

    layer, x = _layer(device, torch.bfloat16)
    with torch.no_grad():
        return {"rel_error_vs_bf16": _rel_error(Nvfp4Linear(layer)(x), layer(x))}


def fa3_fp8_attention(device: Any) -> dict[str, Any] | str:
    import torch
    import torch.nn.functional as F

    from solrl_core.precision import fp8_attention

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if capability is not None and (missing := fp8_attention.fa3_missing(capability)):
        return missing
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v)
    with torch.no_grad(), fp8_attention.swapped(fp8_attention.kernel_for(device)):
        got = F.scaled_dot_product_attention(q, k, v)
    return {"kernel": "torchao FP8 FA3" if capability else "the emulation (no GPU)",
            "rel_error_vs_bf16": _rel_error(got, want)}


def transformer_engine(device: Any) -> dict[str, Any]:
    from solrl_core.precision.hardware import transformer_engine_status

    status = transformer_engine_status()
    return {"imports": status.installed, "version": status.version, "why_not": status.reason}


def run_one(name: str, device_name: str) -> dict[str, Any]:
    """One probe in this process: {'status': 'ran', 'result'} / 'skipped' with 'reason' / 'raised' with 'exception'."""
    import torch

    probe: Callable[[Any], Any] = globals()[name]
    try:
        got = probe(torch.device(device_name))
    except Exception as exc:  # noqa: BLE001 - what the call raised is what the probe records
        return {"status": "raised", "exception": {"class": type(exc).__name__, "message": str(exc)[:2000]}}
    if isinstance(got, str):
        return {"status": "skipped", "reason": got}
    return {"status": "ran", "result": got}


def run_all(device: str, budget_s: float, out: Path | None) -> list[dict[str, Any]]:
    """Each probe in a subprocess, under min(its limit, what is left of `budget_s`); `out` rewritten after each."""
    deadline, records = time.monotonic() + budget_s, []
    for name, own in PROBES.items():
        limit = min(own, deadline - time.monotonic())
        record: dict[str, Any] = {"name": name, "limit_s": round(limit, 1)}
        if limit < 3:
            record |= {"status": "not run", "reason": f"{max(limit, 0):.0f} s left of the probes' {budget_s:.0f} s"}
        else:
            start = time.monotonic()
            try:
                done = subprocess.run([sys.executable, __file__, "--probe", name, "--device", device],
                                      capture_output=True,
                                      text=True, timeout=limit)
                last = done.stdout.strip().splitlines()[-1:] or [""]
                record |= json.loads(last[0]) if last[0].startswith("{") else {
                    "status": "crashed", "rc": done.returncode, "stderr": done.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                record |= {"status": "timed out"}
            record["seconds"] = round(time.monotonic() - start, 2)
        records.append(record)
        print(f"probe {name}: {_said(record)}", flush=True)
        if out is not None:
            out.write_text(json.dumps({"device": device, "probes": records}, indent=2))
    return records


def _said(record: dict[str, Any]) -> str:
    if record["status"] == "raised":
        return f"raised {record['exception']['class']}: {record['exception']['message'].splitlines()[0][:200]}"
    detail = record.get("result") or record.get("reason") or record.get("rc")
    return f"{record['status']}" + (f" ({detail})" if detail is not None else "")


def failed(records: list[dict[str, Any]]) -> list[str]:
    """The probes that did not answer: timed out, crashed, or a bug of the probe's own code."""
    return [r["name"] for r in records if r["status"] in ("timed out", "crashed")
            or (r["status"] == "raised" and (r["exception"]["class"] in CODE_ERRORS
                                              or r["exception"]["class"] in ("ImportError", "ModuleNotFoundError")
                                              and "solrl" in r["exception"]["message"]))]


def main(argv: list[str] | None = None) -> int:
    from _common import add_device_arg, resolved_device  # benchmarks/ is on sys.path when a script runs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_arg(p)
    p.add_argument("--budget", type=float, default=70, help="seconds for all probes together (default 70)")
    p.add_argument("--json", type=Path, metavar="PATH", help="every probe's outcome, rewritten after each")
    # one probe, in this process (run_all's child)
    p.add_argument("--probe", choices=tuple(PROBES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = resolved_device(args.device)
    if args.probe:
        print(json.dumps(run_one(args.probe, device)), flush=True)
        return 0
    bad = failed(run_all(device, args.budget, args.json))
    if bad:
        print(f"probes that did not answer: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
