"""Which attention kernels the update's forwards and backwards may use.

PyTorch's SDPA picks cuDNN's fused attention first on an H100, and its backward fails there at
FLUX.1's shapes (24 heads of 128, 1536 tokens, bf16, batch 8-16): `RuntimeError: Expected
mha_graph.execute(...).is_good() to be true`, or, without CUDA_LAUNCH_BLOCKING, a
CUBLAS_STATUS_EXECUTION_FAILED from the next kernel. Seen on an H100 with torch 2.11.0+cu130, eager
and compiled alike, and gone with the cuDNN backend disabled (docs/BENCHMARKS.md); a known defect
(pytorch/pytorch#122695, #134001). Rollouts (forward only) ran fine with it, so only the update
leaves it out: flash, memory-efficient and math attention remain.
"""

from __future__ import annotations

import contextlib

from torch.nn.attention import SDPBackend, sdpa_kernel

TRAINING_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def training_attention() -> contextlib.AbstractContextManager:
    """SDPA without cuDNN attention inside (any device: on a CPU it changes nothing that runs)."""
    return sdpa_kernel(TRAINING_BACKENDS)
