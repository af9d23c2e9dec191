"""Speed of the emulated NVFP4 explore copy on this machine: one activation quantization
(`precision.nvfp4.fake_quantize_1d`) at the tiny moving world's shape, and one forward of the tiny
moving world's transformer with its explore copy (quantized by the preset's layer rule) against the
same transformer at full precision, at the preset's rollout batch.

    python benchmarks/nvfp4_emulation.py                 # the shipped tiny_video base, 2 threads
    python benchmarks/nvfp4_emulation.py --threads 1 --repeats 20

Medians of interleaved repeats (the two forwards alternate), so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def median_ms(fn, repeats: int, inner: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from solrl_core.config.presets import resolve_config
    from solrl_core.models import load_model
    from solrl_core.precision.nvfp4 import fake_quantize_1d
    from solrl_core.precision.quantize import LayerRule, quantize_model

    cfg = resolve_config(model="tiny_video")
    model = load_model(cfg.model, torch.device("cpu"), torch.float32)
    explore = copy.deepcopy(model.transformer)
    quantize_model(explore, LayerRule.of(cfg.model), "nvfp4-emulated")
    batch = cfg.sampler.rollout_batch
    cond = model.encode(["a red circle moving to the left"] * batch)
    latents, sigmas = torch.randn(batch, *model.latent_shape), torch.rand(batch)
    x = torch.randn(batch, 64, 128)  # a block linear's input: batch x 64 tokens x width 128

    def forward(module: torch.nn.Module) -> None:
        with torch.no_grad():
            model.velocity(module, latents, sigmas, cond)

    quant = median_ms(lambda: fake_quantize_1d(x), args.repeats, 10)
    full, low = [], []
    for _ in range(args.repeats):
        full.append(median_ms(lambda: forward(model.transformer), 1, 1))
        low.append(median_ms(lambda: forward(explore), 1, 1))
    per = 1.0 / batch
    print(f"torch {torch.__version__}, {args.threads} thread(s), tiny_video, batch {batch}")
    print(f"activation quantization {tuple(x.shape)} float32: {quant:.2f} ms (median of {args.repeats} x 10)")
    print(f"forward, ms a sample-step (median of {args.repeats}): full precision {statistics.median(full) * per:.2f}, "
          f"nvfp4-emulated explore copy {statistics.median(low) * per:.2f}")


if __name__ == "__main__":
    main()
