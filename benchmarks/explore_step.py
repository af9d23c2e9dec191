"""Explore-copy speed: one denoising step of a real-size transformer per explore precision.

Builds random-init transformers with the published configurations of SANA-1.6B (1024 px, latent
32x32x32, 300 caption tokens) and FLUX.1-dev 12B (512 px, 1024 image + 128 T5 tokens, the flux1 preset's), in bf16
on the GPU, and times one transformer forward (one denoising step) at the official rollout batch
(24) per backend, through the same wrappers the explore copy uses (`solrl_core/precision/quantize.py`, the
model presets' layer rule: the official skip names and min-dim; at --size tiny the min-dim is scaled
by the tiny width over the real one, so the same layers are quantized):

    bf16            the reference
    fp8             solrl's fp8 explore copy: e4m3 GEMMs through torch._scaled_mm, row-wise scales
    fp8-torchao     torchao's Float8DynamicActivationFloat8WeightConfig(PerRow) on the nn.Linear layers
                    (only when torchao imports; it leaves SANA's 1x1-conv feed-forward in bf16)
    nvfp4-emulated  the exact NVFP4 emulation (numerics only: slower than bf16 by design)

With --compile each backend is also timed torch.compile'd block by block, as solrl compiles (fuses
the input quantization). It also
times the explore copy's refresh (load the merged weights, re-quantize), the per-iteration cost the
paper puts at about 2%, and prints it next to one iteration's explore forwards (derived: step time x
preview steps x N seeds / batch, for one prompt group). Each backend's output is also compared with
the bf16 output on the same inputs (relative RMS error): a check that its kernels compute the right
thing on this device, not a quality figure.

    python benchmarks/explore_step.py                          # SANA and FLUX, on the GPU
    python benchmarks/explore_step.py --models sana --compile --json /tmp/step.json
    python benchmarks/explore_step.py --size tiny --device cpu # the same code on tiny configs

Random weights: speed only, nothing here is a quality measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _common import device_name  # benchmarks/ is on sys.path when a script runs
from torch import nn

from solrl_core.presets import resolve_config
from solrl_core.regions import CompiledBlocks
from solrl_core.precision.quantize import LayerRule, plan_layers, quantize_model, requantize, unwrap_model

# Published transformer configurations (the hub's transformer/config.json), and tiny ones with the
# same structure for a CPU smoke run.
CONFIGS = {
    ("sana", "real"): dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
                           num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
                           caption_channels=2304, mlp_ratio=2.5, sample_size=32, patch_size=1),
    ("sana", "tiny"): dict(in_channels=32, out_channels=32, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                           num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32,
                           caption_channels=32, mlp_ratio=2.5, sample_size=8, patch_size=1),
    ("flux", "real"): dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                           num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                           guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
    ("flux", "tiny"): dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
                           num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                           guidance_embeds=True, axes_dims_rope=(4, 4, 8)),
}
PRESET = {"sana": "sana", "flux": "flux1"}
# tokens: SANA caption tokens (Gemma, 300); FLUX image tokens (512 px -> 64x64x16 latent -> 32x32 packed) and T5 tokens
# (the FLUX figures in docs/BENCHMARKS.md up to 2026-11-24 were taken at 512 T5 tokens, FluxPipeline's default)
TOKENS = {("sana", "real"): 300, ("sana", "tiny"): 8, ("flux", "real"): (1024, 128), ("flux", "tiny"): (16, 8)}
BACKENDS = ("bf16", "fp8", "fp8-torchao", "nvfp4-emulated")


def build(model: str, size: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, Callable[[], dict]]:
    """A random-init transformer and a function making one step's inputs at batch `batch`."""
    from diffusers import FluxTransformer2DModel, SanaTransformer2DModel

    cfg = CONFIGS[(model, size)]
    torch.manual_seed(0)
    with torch.device(device):
        net = (SanaTransformer2DModel if model == "sana" else FluxTransformer2DModel)(**cfg)
    net = net.to(dtype).eval().requires_grad_(False)

    def inputs(batch: int) -> dict:
        g = torch.Generator(device).manual_seed(1)
        t = torch.full((batch,), 500.0 if model == "sana" else 0.5, device=device, dtype=dtype)
        if model == "sana":
            side, text = cfg["sample_size"], TOKENS[(model, size)]
            return dict(hidden_states=torch.randn(batch, cfg["in_channels"], side, side, generator=g, device=device, dtype=dtype),
                        encoder_hidden_states=torch.randn(batch, text, cfg["caption_channels"], generator=g, device=device, dtype=dtype),
                        encoder_attention_mask=torch.ones(batch, text, device=device, dtype=torch.long), timestep=t,
                        return_dict=False)
        image, text = TOKENS[(model, size)]
        return dict(hidden_states=torch.randn(batch, image, cfg["in_channels"], generator=g, device=device, dtype=dtype),
                    encoder_hidden_states=torch.randn(batch, text, cfg["joint_attention_dim"], generator=g, device=device, dtype=dtype),
                    pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g, device=device, dtype=dtype),
                    timestep=t, guidance=torch.ones(batch, device=device, dtype=dtype),
                    img_ids=torch.zeros(image, 3, device=device, dtype=dtype), txt_ids=torch.zeros(text, 3, device=device, dtype=dtype),
                    return_dict=False)

    return net, inputs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference|| / ||reference||, in fp32."""
    return float((out.float() - reference).norm() / reference.norm().clamp(min=1e-12))


def hidden_width(config: dict) -> int:
    return config["num_attention_heads"] * config["attention_head_dim"]


def layer_rule(model: str, size: str) -> LayerRule:
    """The model preset's rule; at tiny size its min-dim scaled to the tiny width."""
    rule = LayerRule.of(resolve_config(PRESET[model], "sol_rl").model)
    if size == "real":
        return rule
    ratio = hidden_width(CONFIGS[(model, "tiny")]) / hidden_width(CONFIGS[(model, "real")])
    return dataclasses.replace(rule, min_dim=round(rule.min_dim * ratio))


def apply_backend(net: nn.Module, backend: str, rule: LayerRule) -> str:
    """Turn `net` (bf16, unwrapped) into `backend` in place; a one-line description of what changed."""
    if backend == "bf16":
        return "bf16 weights and GEMMs"
    if backend in ("fp8", "nvfp4-emulated"):
        return quantize_model(net, rule, backend).summary()
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        PerRow,
        quantize_,
    )

    names = {e.name for e in plan_layers(net, rule) if e.quantized and e.kind == "linear"}
    quantize_(net, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=lambda m, n: n in names)
    return f"torchao float8 (per row) on {len(names)} nn.Linear layers"


def measure(model: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    rule = layer_rule(model, args.size)
    net, inputs = build(model, args.size, device, torch.bfloat16)
    params = sum(p.numel() for p in net.parameters())
    x = inputs(args.batch)
    state = net.state_dict()  # the same tensors: refresh copies them onto themselves
    with torch.no_grad():
        reference = net(**x)[0].float()
    rows = []
    print(f"\n{model}: {params / 1e9:.2f}B parameters, batch {args.batch}, {args.size} config, on {device_name(device)}", flush=True)
    # One model, re-wrapped in place per backend (two copies of FLUX-12B would not fit); torchao's
    # in-place conversion cannot be undone, so it runs last.
    for backend in sorted(args.backends, key=lambda b: b == "fp8-torchao"):
        if backend == "fp8-torchao":
            try:
                import torchao  # noqa: F401
            except Exception as exc:  # noqa: BLE001 - reported, the other backends still run
                print(f"  {backend:<26} skipped: torchao does not import ({type(exc).__name__}: {exc})", flush=True)
                continue
        unwrap_model(net)
        try:
            what = apply_backend(net, backend, rule)
        except Exception as exc:  # noqa: BLE001 - one backend failing must not hide the others
            print(f"  {backend:<26} failed to build: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            continue
        for compiled in ((False, True) if args.compile else (False,)):
            fn = CompiledBlocks(net, active=False) if compiled else net  # as the explore copy compiles: block by block
            label = backend + (" +compile" if compiled else "")
            try:
                with torch.no_grad():
                    seconds = time_call(lambda fn=fn: fn(**x), device, args.warmup, args.repeats)
                    error = relative_error(fn(**x)[0], reference)
            except Exception as exc:  # noqa: BLE001
                print(f"  {label:<26} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
                continue
            rows.append(dict(model=model, backend=backend, compiled=compiled, seconds=seconds, rel_error=error, layers=what))
            print(f"  {label:<26} {seconds * 1e3:9.2f} ms/step   error vs bf16 {100 * error:6.2f}%   ({what})", flush=True)
        if backend in ("fp8", "nvfp4-emulated"):
            def refresh() -> None:
                net.load_state_dict(state, strict=False)
                requantize(net)
            seconds = time_call(refresh, device, 1, max(3, args.repeats // 3))
            rows.append(dict(model=model, backend=backend, refresh_seconds=seconds))
            print(f"  {backend:<26} refresh {seconds * 1e3:7.1f} ms (load merged weights + re-quantize)", flush=True)
    base = next((r["seconds"] for r in rows if r.get("backend") == "bf16" and not r["compiled"]), None)
    if base:
        print(f"  speed-up over eager bf16 ({device_name(device)}, batch {args.batch}):")
        for r in rows:
            if "seconds" in r:
                print(f"    {r['backend'] + (' +compile' if r['compiled'] else ''):<26} {base / r['seconds']:6.2f}x")
        fp8_step = next((r["seconds"] for r in rows if r.get("backend") == "fp8" and "seconds" in r), None)
        fp8_refresh = next((r["refresh_seconds"] for r in rows if r.get("backend") == "fp8" and "refresh_seconds" in r), None)
        if fp8_step and fp8_refresh:
            explore = fp8_step * args.preview_steps * args.group / args.batch
            print(f"  fp8 refresh {fp8_refresh * 1e3:.1f} ms vs one prompt group's explore forwards "
                  f"({args.group} seeds x {args.preview_steps} steps at batch {args.batch}: {explore:.2f} s, derived from "
                  f"the step time): {100 * fp8_refresh / explore:.1f}% per group, less with more groups per refresh")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["sana", "flux"], choices=("sana", "flux"))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--size", default="real", choices=("real", "tiny"), help="published configs, or tiny ones for a smoke run")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=24, help="rollout batch (official: 24)")
    p.add_argument("--preview-steps", type=int, default=6, help="explore steps, for the refresh share (default: 6)")
    p.add_argument("--group", type=int, default=96, help="N, seeds per prompt, for the refresh share (default: 96)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="also time each backend torch.compile'd")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every timing here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.size == "real":
        sys.exit("real sizes need a GPU (SANA-1.6B and FLUX-12B in bf16); use --size tiny on a CPU")
    print(f"torch {torch.__version__}; device {device_name(device)}")
    rows = []
    for model in args.models:
        rows += measure(model, args, device)
        if device.type == "cuda":  # the model of `measure` is gone: hand its memory back before the next
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(dict(device=device_name(device), torch=torch.__version__, args=vars(args) | {"json": str(args.json)},
                                             rows=rows), indent=2))


if __name__ == "__main__":
    main()
