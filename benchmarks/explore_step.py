"""Explore-copy speed: one denoising step of a real-size transformer per explore precision.

Builds random-init transformers with the published configurations of SANA-1.6B (1024 px, latent
32x32x32, 300 caption tokens), FLUX.1-dev 12B (512 px, 1024 image + 128 T5 tokens, the flux1 preset's) and
Wan 2.1 T2V 1.3B (the wan21_t2v_1_3b preset's clip), in bf16
on the GPU, and times one transformer forward (one denoising step) at the official rollout batch
(24) per backend, through the same wrappers the explore copy uses (`solrl_core/precision/quantize.py`, the
model presets' layer rule: the official skip names and min-dim; at --size tiny the min-dim is scaled
by the tiny width over the real one, so the same layers are quantized):

    bf16             the reference
    fp8              solrl's fp8 explore copy: e4m3 GEMMs through torch._scaled_mm, row-wise scales
    fp8-e5m2-tensor  the official explore copy's numerics: per-tensor FP8 E5M2, emulated (no speed-up)
    nvfp4-emulated   the exact NVFP4 emulation (numerics only: slower than bf16 by design)
    fp8-torchao      fp8 through torchao's Float8Tensor, PerRow dynamic activation + weight, on the same
                     layers as fp8 (explore.fp8_backend=torchao; needs torchao)
    nvfp4            real NVFP4 GEMMs: torchao's NVFP4Tensor over solrl's exact quantizer, torch._scaled_mm
                     on float4 (compute capability >= 10.0; needs torchao)
    fp8+fp8-attention fp8 with torchao's FP8 FA3 attention (explore.fp8_attention): FLUX.1 and Wan on
                     compute capability 9.x with flash-attn's FA3 build; elsewhere its reason instead of a time

A backend this device cannot run is skipped with its reason (nvfp4 everywhere below Blackwell).
`--list-backends` prints the backends, one a line, for a caller that runs them all (`--backends all`).

With --compile each backend is also timed torch.compile'd block by block, as solrl compiles (fuses
the input quantization). It also
times the explore copy's refresh (load the merged weights, re-quantize), the per-iteration cost the
paper puts at about 2%, and prints it next to one iteration's explore forwards (derived: step time x
preview steps x N seeds / batch, for one prompt group). Each backend's output is also compared with
the bf16 output on the same inputs (relative RMS error): a check that its kernels compute the right
thing on this device, not a quality figure.

    python benchmarks/explore_step.py                          # SANA, FLUX and Wan, on the GPU
    python benchmarks/explore_step.py --models sana --compile --json /tmp/step.json
    python benchmarks/explore_step.py --size tiny --device cpu # the same code on tiny configs

The measuring is `solrl bench --explore`'s (solrl_core/bench/explore.py); this script keeps its
command line and JSON. On a CPU it runs fp8 through torch's reference `_scaled_mm` kernel (exact
numerics, no speed-up), which `solrl bench --explore` does only with --numerics-only.

Random weights: speed only, nothing here is a quality measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from _common import add_device_arg, resolved_device  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.bench.explore import BACKENDS, ExploreOptions, run_explore
from solrl_core.config.choices import COMPILE_MODES
from solrl_core.telemetry.peaks import device_label

PRESET = {"sana": "sana", "flux": "flux1", "wan": "wan21_t2v_1_3b"}  # this script's model names -> the model presets
LABEL = {v: k for k, v in PRESET.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(PRESET), choices=tuple(PRESET))
    p.add_argument("--backends", nargs="+", default=["all"], choices=("all", *BACKENDS), help="default: all")
    p.add_argument("--list-backends", action="store_true", help="print every backend, one a line, and exit")
    p.add_argument("--size", default="real", choices=("real", "tiny"), help="published configs, or tiny ones for a "
                                                                            "smoke run")
    add_device_arg(p)
    p.add_argument("--batch", type=int, default=24, help="rollout batch (official: 24)")
    p.add_argument("--preview-steps", type=int, default=6, help="explore steps, for the refresh share (default: 6)")
    p.add_argument("--group", type=int, default=96, help="N, seeds per prompt, for the refresh share (default: 96)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="also time each backend torch.compile'd")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, help="with --compile: run.compile_mode (default: the "
                   "config's, max-autotune-no-cudagraphs; a lease uses default: autotuning a GEMM shape took 44-66 s "
                   "on the H100)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every timing here")
    args = p.parse_args(argv)
    if args.list_backends:
        print("\n".join(BACKENDS))
        return
    backends = BACKENDS if "all" in args.backends else tuple(dict.fromkeys(args.backends))
    args.device = resolved_device(args.device)
    device = torch.device(args.device)
    if device.type == "cpu" and args.size == "real":
        sys.exit("real sizes need a GPU (SANA-1.6B and FLUX-12B in bf16); use --size tiny on a CPU")
    print(f"torch {torch.__version__}; device {device_label(device)}")
    options = ExploreOptions(models=tuple(PRESET[m] for m in args.models), backends=backends, size=args.size,
                             device=args.device, batch=args.batch, group=args.group, steps=args.preview_steps,
                             warmup=args.warmup, repeats=args.repeats, compile=args.compile,
                             compile_mode=args.compile_mode,
                             numerics_only=True)
    bus = ev.EventBus()
    bus.subscribe(lambda e: print(e.message, flush=True) if isinstance(e, ev.BenchProgress) else None)
    # the JSON after each backend: a run cut off (a lease's time limit) leaves what it measured
    result = run_explore(options, bus, on_backend=(lambda so_far: _write(args, so_far)) if args.json else None)
    if args.json:
        _write(args, result)


def _write(args: argparse.Namespace, result: Any) -> None:
    from solrl_core.io.atomic import write_atomic

    rows = [{**r, "model": LABEL[r["model"]]} for r in result.rows]
    write_atomic(args.json,
                 json.dumps(dict(device=result.device, torch=result.torch, args=vars(args) | {"json": str(args.json)},
                                            rows=rows), indent=2))


if __name__ == "__main__":
    main()
