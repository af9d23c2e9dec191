"""Regional compilation: torch.compile the transformer's repeated blocks, not the whole network.

A transformer is a stack of identical blocks (SANA: 20, FLUX.1: 19 + 38, SD3.5: 24-38). Compiled
whole, Inductor traces and optimises every block again: on an H100 a whole SANA-1.6B forward took
45-65 s to compile and its forward+backward about 4 minutes, so a run's warm-up (explore copy,
rollout copy at three batch sizes, the update) took over 9 minutes before the first iteration
(docs/BENCHMARKS.md). Compiled per block, one block's graph is compiled once and reused by every
block of its class (with torch's default `inline_inbuilt_nn_modules` the weights are graph inputs),
which is what diffusers' `compile_repeated_blocks` and PyTorch's regional-compilation recipe do. The
few layers outside the blocks (embeddings, final norm) stay eager.

`CompiledBlocks` switches the compiled blocks on and off: the copies keep them on; the policy turns
them on only for the update (forward and backward, which must match when gradient checkpointing
recomputes a block), so evaluation and the eager baselines' rollouts on the policy stay eager.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn

# Every compiled block's graph is filed under one code object (nn.Module._call_impl), so all count
# against one recompile limit, 8 by default: the explore copy, the rollout copy and the policy (per
# grad mode and adapter state) each need a few graphs per block class and batch size. Past the
# limit Dynamo would run the blocks eager without an error.
RECOMPILE_LIMIT = 64

# The update's compiled blocks (optimizer.compile) compile in torch's default mode, whatever
# run.compile_mode says: that mode is the official code's for its inference copies, and the official
# update runs eager, so there is no official mode to follow; max-autotune would also autotune every
# GEMM of each forward and backward graph (one per adapter state and grad mode) before iteration 1.
UPDATE_COMPILE_MODE = "default"

# Under a max-autotune mode, the fp8 explore copy's GEMMs (torch._scaled_mm) are not autotuned: they
# run cuBLAS's kernel, as in the default mode, while everything else follows the mode. Measured on an
# H100 (docs/BENCHMARKS.md, 2026-11-27, FLUX.1-12B): Inductor autotuned each fp8 GEMM shape for 44 to
# 66 s (97 to 106 candidate kernels), six shapes in the first blocks took 365 s with the warm-up far
# from done, and it chose cuBLAS's `_scaled_mm` for five of the six (the sixth, a 3072x3072x3072
# GEMM, ran 0.088 ms against cuBLAS's 0.122).
NO_GEMM_AUTOTUNE = {"max_autotune_gemm_backends": "ATEN"}


def compile_mode_for(mode: str, module: nn.Module) -> str:
    """The mode `module` compiles in: `mode` on CUDA, torch's default on a CPU. On a CPU, Inductor's
    max-autotune tries its C++ GEMM templates, and on the tiny model's compiled rollout copy it failed
    (InductorError 'expected Y numel == epilogue numel', torch 2.14, tests/test_bench.py's compile
    family) after printing its autotune tables; the official mode is a GPU setting."""
    on_cuda = any(p.device.type == "cuda" for p in module.parameters())
    return mode if on_cuda else "default"


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The blocks to compile: the classes named in diffusers' `_repeated_blocks` where the model
    declares them, else the members of every ModuleList of two or more modules of one class (SANA's
    `transformer_blocks`, say). Empty for a network without repeated blocks."""
    names = set(getattr(module, "_repeated_blocks", None) or ())
    if names:
        return [m for m in module.modules() if type(m).__name__ in names]
    found: list[nn.Module] = []
    inside: list[str] = []  # names of the blocks found: lists within them are theirs, not blocks of their own
    for name, child in module.named_modules():
        if any(name.startswith(f"{block}.") for block in inside):
            continue
        if isinstance(child, nn.ModuleList) and len(child) >= 2 and len({type(m) for m in child}) == 1:
            found.extend(child)
            inside.extend(f"{name}.{i}" if name else str(i) for i in range(len(child)))
    return found


class CompiledBlocks:
    """`module` with its repeated blocks torch.compile'd (the whole module where it has none), in
    torch.compile's `mode` on CUDA ('default': no mode passed; on a CPU always the default, see
    `compile_mode_for`). A backend other than Inductor (the tests' aot_eager) ignores a mode with a
    logged warning."""

    def __init__(self, module: nn.Module, mode: str = "default", active: bool = True,
                 gemm_autotune: bool = True) -> None:
        """`gemm_autotune` False: under a max-autotune mode, GEMMs run ATen's kernels untuned (NO_GEMM_AUTOTUNE)."""
        import torch._dynamo
        import torch._inductor

        # inductor's C++ path imports cpp_extension, which warns of a CUDA_HOME without a GPU
        if not torch.cuda.is_available():
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.module = module
        self.regions = repeated_blocks(module) or [module]
        self.mode = compile_mode_for(mode, module)
        options: dict = {} if self.mode == "default" else {"mode": self.mode}
        if options and not gemm_autotune and torch._inductor.list_mode_options(self.mode).get("max_autotune"):
            options = {"options": {**torch._inductor.list_mode_options(self.mode), **NO_GEMM_AUTOTUNE}}
        self.options = options  # what torch.compile is given
        self._compiled = [torch.compile(r._call_impl, **options) for r in self.regions]
        self.active = False
        if active:
            self._set(True)

    def _set(self, on: bool) -> None:
        for region, compiled in zip(self.regions, self._compiled):
            region._compiled_call_impl = compiled if on else None
        self.active = on

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        """The blocks compiled inside the block (forward and backward both), as before outside it."""
        if self.active:
            yield
            return
        self._set(True)
        try:
            yield
        finally:
            self._set(False)

    def __call__(self, *args, **kwargs):
        with self.on():
            return self.module(*args, **kwargs)
