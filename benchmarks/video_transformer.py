"""The tiny moving world's choice of transformer: a tiny diffusers WanTransformer3DModel over a clip's
frame tokens against the tiny SANA transformer over the same frames as a batch of images, same width,
depth and patch, one forward (and Wan's forward + backward) at batch 32 on the CPU.

    python benchmarks/video_transformer.py --frames 4 --side 24 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from diffusers import SanaTransformer2DModel, WanTransformer3DModel


def seconds(fn, repeats: int = 3) -> float:  # noqa: ANN001
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--side", type=int, default=24)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, f, s, p, text_dim = args.batch, args.frames, args.side, args.patch, 64
    text, t = torch.randn(b, 12, text_dim), torch.rand(b) * 1000
    wan = WanTransformer3DModel(patch_size=(1, p, p), num_attention_heads=4, attention_head_dim=32, in_channels=3,
                                out_channels=3, text_dim=text_dim, freq_dim=64, ffn_dim=256, num_layers=4,
                                rope_max_seq_len=64)
    sana = SanaTransformer2DModel(in_channels=3, out_channels=3, num_attention_heads=4, attention_head_dim=32,
                                  num_layers=4,
                                  num_cross_attention_heads=4, cross_attention_head_dim=32, cross_attention_dim=128,
                                  caption_channels=text_dim, sample_size=s, patch_size=p)
    clips = torch.randn(b, 3, f, s, s)
    frames = clips.permute(0, 2, 1, 3, 4).reshape(b * f, 3, s, s)
    with torch.no_grad():
        wan_fwd = seconds(lambda: wan(clips, t, text, return_dict=False))
        sana_fwd = seconds(lambda: sana(frames, encoder_hidden_states=text.repeat_interleave(f, 0),
                                        timestep=t.repeat_interleave(f), return_dict=False))

    def wan_step() -> None:
        wan(clips, t, text, return_dict=False)[0].square().mean().backward()

    wan_train = seconds(wan_step)
    tokens = f * (s // p) ** 2
    print(f"{b} clips of {f} frames {s}x{s}, patch {p} ({tokens} tokens a clip), {args.threads} thread(s), torch "
          f"{torch.__version__}")
    print(f"Wan  {sum(q.numel() for q in wan.parameters()) / 1e6:.2f}M parameters: forward {wan_fwd:.3f} s, forward + "
          f"backward {wan_train:.3f} s")
    print(f"SANA {sum(q.numel() for q in sana.parameters()) / 1e6:.2f}M parameters, frames as images: forward "
          f"{sana_fwd:.3f} s")


if __name__ == "__main__":
    main()
