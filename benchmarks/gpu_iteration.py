"""End-to-end iteration time of sol_rl against the compiled bf16 baseline, through `solrl train`'s code.

Builds, in the hub's diffusers layout, random-init pipelines whose transformers have the published
SANA-1.6B and FLUX.1-dev 12B configurations, with one-layer text encoders of the real widths (Gemma2
2304; CLIP-L 768 + T5-XXL 4096) and two-block VAEs with the real latent channels, at a resolution
that gives the real latent (SANA 64 px -> 32x32x32; FLUX 128 px -> 64x64x16, 1024 image tokens), then
trains each family for a few iterations at one prompt group of N=96 explored and K=24 kept, with a
JPEG reward (cheap, on the CPU), and prints seconds per phase, peak memory per phase, the one-time
compile times, the doctor's memory estimate for the same settings next to the measured peak, and each family's total and rollout (explore + regenerate) time over the `compile`
family's, the strongest honest baseline (compiled bf16 rollouts, as the official baselines are).

    python benchmarks/gpu_iteration.py                                  # SANA and FLUX on the GPU
    python benchmarks/gpu_iteration.py --models sana --json /tmp/it.json
    python benchmarks/gpu_iteration.py --size tiny --device cpu --n 8 --k 4   # the same code on a CPU

The first `--warmup` iterations of each family are dropped. Random weights: speed and memory only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the offline tokenizers and tiny encoders the tests build
from _common import device_name  # noqa: E402  (benchmarks/ is on sys.path when a script runs)

from solrl_core import events as ev  # noqa: E402
from solrl_core.footprint import estimate_memory  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.trainer import StopFlag, train  # noqa: E402

FAMILIES = ("sol_rl", "naive_scaling", "compile")
PRESET = {"sana": "sana", "flux": "flux1"}
RESOLUTION = {("sana", "real"): 64, ("flux", "real"): 128, ("sana", "tiny"): 32, ("flux", "tiny"): 32}
PHASES = ("explore", "regenerate", "reward", "train", "sync", "total")


def build_pipeline(model: str, size: str, folder: Path, device: str = "cpu") -> Path:
    """Save a random-init pipeline of `model` at `size` into `folder` (diffusers layout); the FLUX
    transformer is initialised on `device` in bf16 (12B parameters: minutes in fp32 on a CPU)."""
    import tiny_pipelines as tp

    torch.manual_seed(0)
    if size == "tiny":
        pipe = tp.BUILDERS[PRESET[model]]()
    elif model == "sana":
        from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
        from transformers import Gemma2Config, Gemma2Model

        tok = tp.gemma_tokenizer()
        te = Gemma2Model(Gemma2Config(head_dim=256, hidden_size=2304, intermediate_size=512, num_attention_heads=2,
                                      num_hidden_layers=1, num_key_value_heads=1, vocab_size=len(tok), pad_token_id=0)).eval()
        blocks = ("ResBlock", "EfficientViTBlock")
        vae = AutoencoderDC(in_channels=3, latent_channels=32, attention_head_dim=8, encoder_block_types=blocks,
                            decoder_block_types=blocks, encoder_block_out_channels=(32, 64),
                            decoder_block_out_channels=(32, 64), encoder_qkv_multiscales=((), (5,)),
                            decoder_qkv_multiscales=((), (5,)), encoder_layers_per_block=(1, 1),
                            decoder_layers_per_block=(1, 1), downsample_block_type="conv", upsample_block_type="interpolate",
                            decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)
        tr = SanaTransformer2DModel(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                                    num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
                                    cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5, sample_size=32,
                                    patch_size=1).to(torch.bfloat16)
        pipe = SanaPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=tr,
                            scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))
    else:
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

        tok, tok2 = tp.clip_tokenizer(), tp.t5_tokenizer()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                tr = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                                            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                            pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
        finally:
            torch.set_default_dtype(default)
        tr = tr.to("cpu", torch.bfloat16)
        pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=tp.kl_vae(16), transformer=tr,
                            text_encoder=tp.clip_encoder(tok, 768, 768, with_projection=False), tokenizer=tok,
                            text_encoder_2=tp.t5_encoder(tok2, 4096), tokenizer_2=tok2)
    pipe.save_pretrained(str(folder))
    del pipe
    return folder


def run_family(model: str, family: str, folder: Path, args: argparse.Namespace, root: Path) -> dict:
    sets = [f"model.path={folder}", f"model.resolution={RESOLUTION[(model, args.size)]}", f"explore.group_size={args.n}",
            f"selection.group_size={args.k}", "run.prompts_per_iteration=1", f"run.iterations={args.iterations}",
            f"run.checkpoint_every={args.iterations}", f"run.device={args.device}", f"run.run_dir={root / f'{model}-{family}'}",
            "run.eval_prompts=", f"sampler.rollout_batch={args.rollout_batch}", *args.sets]
    cfg = resolve_config(PRESET[model], family, "jpeg_compressibility", sets=sets)
    seen: list[ev.Event] = []
    graphs: list[int] = []  # Dynamo's count of graphs compiled so far, read as each iteration ends
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    bus.subscribe(lambda e: graphs.append(compiled_graphs()) if isinstance(e, ev.IterationFinished) else None)
    bus.subscribe(lambda e: print(f"  {model} {family} iteration {e.iteration}/{e.iterations}: {e.seconds['total']:.2f} s ("
                                  + ", ".join(f"{k} {e.seconds.get(k, 0.0):.2f}" for k in PHASES[:-1]) + ")",
                                  flush=True) if isinstance(e, ev.IterationFinished) else None)
    bus.subscribe(lambda e: print(f"  {model} {family}: compiled {e.target} in {e.seconds:.1f} s", flush=True)
                  if isinstance(e, ev.CompileFinished) else None)
    session = train(cfg, bus, stop=StopFlag())
    machine = session.run.machine  # the doctor's estimate is of the preset's real model: only a real size compares
    estimate = estimate_memory(session.run.config, machine.explore_precision, session.run.dtype_name, machine.checkpointing,
                               machine.rollout_copy, machine.update_compile).peak if args.size == "real" else None
    its = [e for e in seen if isinstance(e, ev.IterationFinished)][args.warmup:]
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    if args.device != "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"model": model, "family": family, "plan": started.plan, "machine": started.machine,
            "seconds": {k: statistics.mean(e.seconds.get(k, 0.0) for e in its) for k in PHASES},
            "peak_gib": {k: max((e.peak_memory or {}).get(k, 0.0) for e in its) for k in ("explore", "regenerate", "train", "sync", "total")},
            "memory_source": its[-1].memory_source, "estimate_gib": estimate,
            "compile_seconds": {e.target: e.seconds for e in seen if isinstance(e, ev.CompileFinished)},
            "iterations_measured": len(its),
            # graphs Dynamo compiled during the measured iterations: any is a recompile after warm-up
            "graphs_after_warmup": graphs[-1] - graphs[args.warmup - 1] if args.warmup else None}


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process (Dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def report(rows: list[dict], device: str) -> None:
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        print(f"\n{model}: seconds per iteration (mean of {mine[0]['iterations_measured']} after warm-up), peak memory "
              f"({mine[0]['memory_source']}), on {device}")
        print(f"  {'family':<14}" + "".join(f"{p:>11}" for p in PHASES) + f"{'peak GiB':>10}{'doctor est':>12}  compile (one time)")
        for r in mine:
            s, comp = r["seconds"], ", ".join(f"{k} {v:.1f}s" for k, v in r["compile_seconds"].items()) or "-"
            est = f"{r['estimate_gib']:12.2f}" if r.get("estimate_gib") is not None else f"{'-':>12}"
            print(f"  {r['family']:<14}" + "".join(f"{s[p]:11.2f}" for p in PHASES) + f"{r['peak_gib']['total']:10.2f}{est}  {comp}")
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["sana", "flux"], choices=tuple(PRESET))
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--size", default="real", choices=("real", "tiny"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=96, help="N, seeds explored per prompt (official 96)")
    p.add_argument("--k", type=int, default=24, help="K, seeds kept per prompt (official 24)")
    p.add_argument("--rollout-batch", type=int, default=24, help="samples per rollout forward (official 24)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--json", type=Path, metavar="PATH")
    args = p.parse_args(argv)
    if args.iterations <= args.warmup:
        p.error("--iterations must exceed --warmup")
    if args.device == "cpu" and args.size == "real":
        sys.exit("real sizes need a GPU (SANA-1.6B and FLUX-12B); use --size tiny on a CPU")
    device = device_name(args.device)
    print(f"torch {torch.__version__}; device {device}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in args.models:
            folder = build_pipeline(model, args.size, root / f"{model}-pipeline", args.device)
            if args.device != "cpu" and torch.cuda.is_available():
                torch.cuda.empty_cache()
            for family in args.families:
                rows.append(run_family(model, family, folder, args, root))
    report(rows, device)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows,
                                         "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}},
                                        indent=2))
    return rows


if __name__ == "__main__":
    main()
