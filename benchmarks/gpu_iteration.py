"""End-to-end iteration time of sol_rl against the compiled bf16 baseline, through `solrl train`'s code.

Builds, in the hub's diffusers layout, random-init pipelines whose transformers have the published
SANA-1.6B and FLUX.1-dev 12B configurations, with one-layer text encoders of the real widths (Gemma2
2304; CLIP-L 768 + T5-XXL 4096) and two-block VAEs with the real latent channels, at a resolution
that gives the real latent (SANA 64 px -> 32x32x32; FLUX 128 px -> 64x64x16, 1024 image tokens), then
trains each family for a few iterations at one prompt group of N=96 explored and K=24 kept, with a
JPEG reward (cheap, on the CPU), and prints seconds per phase, peak memory per phase, the one-time
compile times, the doctor's memory estimate for the same settings next to the measured peak, and each family's total and
rollout (explore + regenerate) time over the `compile`
family's, the strongest honest baseline (compiled bf16 rollouts, as the official baselines are).

    python benchmarks/gpu_iteration.py                                  # SANA and FLUX on the GPU
    python benchmarks/gpu_iteration.py --models sana --json /tmp/it.json
    python benchmarks/gpu_iteration.py --size tiny --device cpu --n 8 --k 4   # the same code on a CPU
    python benchmarks/gpu_iteration.py --models sana --compile-mode default max-autotune-no-cudagraphs
    python benchmarks/gpu_iteration.py --models flux --real-vae --reward-model pickscore # decoding and scoring at real
    cost
    python benchmarks/gpu_iteration.py --models wan       # Wan 2.1 T2V 1.3B (solrl bench's Wan pipeline: docs/bench.md)

The first `--warmup` iterations of each family are dropped. Random weights: speed and memory only.
The work is `solrl bench`'s (solrl_core/bench/run.py), which also prints throughput and MFU per phase;
this script keeps its commands and its table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from _common import add_device_arg, resolved_device  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.bench.run import BenchOptions, run_bench
from solrl_core.config.choices import COMPILE_MODES
from solrl_core.errors import SolrlError
from solrl_core.telemetry.peaks import device_label

FAMILIES = ("sol_rl", "naive_scaling", "compile")
PRESET = {"sana": "sana", "flux": "flux1", "wan": "wan21_t2v_1_3b"}
PHASES = ("explore", "regenerate", "reward", "train", "sync", "total")


def _printer(model: str) -> ev.Subscriber:
    def show(e: ev.Event) -> None:
        if isinstance(e, ev.BenchProgress):
            print(f"  {model}: {e.message}", flush=True)
        elif isinstance(e, ev.IterationFinished):
            print(f"  {model} iteration {e.iteration}/{e.iterations}: {e.seconds['total']:.2f} s ("
                  + ", ".join(f"{k} {e.seconds.get(k, 0.0):.2f}" for k in PHASES[:-1]) + ")", flush=True)
        elif isinstance(e, ev.CompileFinished):
            print(f"  {model}: compiled {e.target} in {e.seconds:.1f} s", flush=True)
    return show


def run_model(model: str, args: argparse.Namespace) -> list[dict]:
    """`solrl bench` for one model, with the script's model names ("sana", "flux") in the rows; with
    --compile-mode, once per mode, the mode in the row's name ("sana [default]")."""
    rows: list[dict] = []
    for mode in args.compile_mode or [None]:
        label = model if mode is None else f"{model} [{mode}]"
        options = BenchOptions(model=PRESET[model], families=tuple(args.families), size=args.size, device=args.device,
                               n=args.n,
                               k=args.k, rollout_batch=args.rollout_batch, iterations=args.iterations,
                               warmup=args.warmup,
                               sets=(*args.sets, *(() if mode is None else (f"run.compile_mode={mode}",))),
                               real_vae=args.real_vae, reward_model=args.reward_model)
        bus = ev.EventBus()
        bus.subscribe(_printer(label))
        rows += [{**r, "model": label} for r in run_bench(options, bus).rows]
    return rows


def report(rows: list[dict], device: str) -> None:
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        print(f"\n{model}: seconds per iteration (mean of {mine[0]['iterations_measured']} after warm-up), peak memory "
              f"({mine[0]['memory_source']}), on {device}")
        print(f"  {'family':<14}" + "".join(f"{p:>11}" for p in PHASES) + f"{'peak GiB':>10}{'doctor est':>12}  "
                                                                          f"compile (one time)")
        for r in mine:
            s, comp = r["seconds"], ", ".join(f"{k} {v:.1f}s" for k, v in r["compile_seconds"].items()) or "-"
            est = f"{r['estimate_gib']:12.2f}" if r.get("estimate_gib") is not None else f"{'-':>12}"
            print(f"  {r['family']:<14}" + "".join(f"{s[p]:11.2f}" for p in PHASES)
                  + f"{r['peak_gib']['total']:10.2f}{est}  {comp}")
        for r in mine:
            if r.get("mfu"):
                print(f"  {r['family']} MFU: "
                      + ", ".join(f"{p} {100 * r['mfu'][p]:.1f}% {r['precision'].get(p, '')}".rstrip()
                                                         for p in ("explore", "regenerate", "train", "total")
                                                         if r["mfu"].get(p) is not None))
        for r in mine:
            if r.get("graphs_after_warmup") is not None:
                print(f"  {r['family']}: {r['graphs_after_warmup']} graphs compiled after warm-up"
                      + ("" if r["graphs_after_warmup"] == 0 else " (RECOMPILED: TORCH_LOGS=recompiles says why)"))
        if all(r.get("estimate_gib") is None for r in mine):
            print("  (doctor est: the doctor's GPU estimate is of the preset's real model, shown at --size real only)")
        base = next((r for r in mine if r["family"] == "compile"), None)
        if base is None:
            print("  (no compile family measured: no ratio against the compiled baseline)")
            continue
        rollout = lambda r: r["seconds"]["explore"] + r["seconds"]["regenerate"]  # noqa: E731
        for r in mine:
            if r is not base:
                print(f"  {r['family']} vs compile: total {base['seconds']['total'] / r['seconds']['total']:.2f}x, "
                      f"rollout (explore + regenerate) {rollout(base) / rollout(r):.2f}x")


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["sana", "flux"], choices=tuple(PRESET))
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--size", default="real", choices=("real", "tiny"))
    add_device_arg(p)
    p.add_argument("--n", type=int, default=96, help="N, seeds explored per prompt (official 96)")
    p.add_argument("--k", type=int, default=24, help="K, seeds kept per prompt (official 24)")
    p.add_argument("--rollout-batch", type=int, default=24, help="samples per rollout forward (official 24)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--real-vae", action="store_true", help="the published VAE (random weights) at the preset's "
                   "resolution instead of the two-block one: decoding costs what it does in a real run (flux1, sd3)")
    p.add_argument("--reward-model", default="jpeg", choices=("jpeg", "pickscore"),
                   help="jpeg: a cheap reward on the CPU; pickscore: a random-weight CLIP ViT-H/14 (PickScore_v1's "
                        "size) on the device")
    p.add_argument("--json", type=Path, metavar="PATH")
    p.add_argument("--compile-mode", nargs="+", choices=COMPILE_MODES, metavar="MODE",
                   help="run.compile_mode of the compiled copies, each timed in turn (default: the config's, "
                        f"max-autotune-no-cudagraphs); choices: {', '.join(COMPILE_MODES)}")
    args = p.parse_args(argv)
    if args.iterations <= args.warmup:
        p.error("--iterations must exceed --warmup")
    args.device = resolved_device(args.device)
    device = device_label(args.device)
    print(f"torch {torch.__version__}; device {device}")
    try:
        rows = [row for model in args.models for row in run_model(model, args)]
    except SolrlError as exc:
        sys.exit(f"{exc.message} ({exc.fix})" if exc.fix else exc.message)
    report(rows, device)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows,
                                         "args": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in vars(args).items()}},
                                        indent=2))
    return rows


if __name__ == "__main__":
    main()
