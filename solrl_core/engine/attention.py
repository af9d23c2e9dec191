"""Which attention kernels the update's forwards and backwards may use.

PyTorch's SDPA picks cuDNN's fused attention first on an H100, and its backward fails there at
FLUX.1's shapes (24 heads of 128, 1536 tokens, bf16, batch 8-16): `RuntimeError: Expected
mha_graph.execute(...).is_good() to be true`, or, without CUDA_LAUNCH_BLOCKING, a
CUBLAS_STATUS_EXECUTION_FAILED from the next kernel. Seen on an H100 with torch 2.11.0+cu130, eager
and compiled alike, and gone with the cuDNN backend disabled (docs/BENCHMARKS.md); a known defect
(pytorch/pytorch#122695, #134001). Rollouts (forward only) ran fine with it, so only the update
leaves it out: flash, memory-efficient and math attention remain.

torch's compile caches (FX graph and AOTAutograd, on disk) do not key on the SDPA backends, so a
graph compiled with cuDNN attention by an earlier run would be loaded again (seen on that H100): the
update's compiles carry their own cache-key tag, which keeps them apart from such graphs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

TRAINING_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
CACHE_TAG = "solrl-update-without-cudnn-attention"


@contextlib.contextmanager
def training_attention() -> Iterator[None]:
    """SDPA without cuDNN attention inside, compiled under its own cache-key tag (any device: on a
    CPU it changes nothing that runs)."""
    config = getattr(torch.compiler, "config", None)  # torch >= 2.6; older versions have no cache-key tag
    if config is None or not hasattr(config, "cache_key_tag"):
        tagged = contextlib.nullcontext()
    else:
        tag = config.cache_key_tag
        tagged = config.patch(cache_key_tag=f"{tag}+{CACHE_TAG}" if tag else CACHE_TAG)
    with sdpa_kernel(TRAINING_BACKENDS), tagged:
        yield
