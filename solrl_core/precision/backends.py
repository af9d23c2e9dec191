"""Which kernel runs each explore precision (its backend), whether a speed figure exists for it on a
GPU of this compute capability, and the layer wrappers of the library backends.

    precision        backend     kernel
    fp8              scaled_mm   solrl's FP8 GEMM wrapper of torch._scaled_mm (precision/fp8.py): the default
    fp8              torchao     torchao's Float8Tensor, dynamic activation + weight, PerRow, as
                                 Float8DynamicActivationFloat8WeightConfig builds it (explore.fp8_backend=torchao)
    nvfp4            torchao     torchao's NVFP4Tensor over solrl's exact quantizer, torch._scaled_mm on
                                 float4 (precision/nvfp4_gemm.py)
    nvfp4-emulated,  emulation   plain torch (precision/nvfp4.py, e5m2.py)
    fp8-e5m2-tensor
    bf16, fp32       torch       the model's own GEMMs

Which of fp8's two backends is the default is for a GPU timing to decide: scaled_mm stays until
`benchmarks/explore_step.py --backends fp8 fp8-torchao --compile` has timed both on an H100 (it is
the one timed there so far, docs/BENCHMARKS.md); torchao is selectable meanwhile, because its
fused dynamic-quantization path is the one whose published FLUX.1 figure (1.54x) is above ours.

`MEASURED` lists the (precision, backend) pairs with a speed figure, by compute capability; the
doctor and the start-up line say "unmeasured on this GPU" for any other, and nothing claims a speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from solrl_core.precision import nvfp4_gemm
from solrl_core.precision.nvfp4 import quantize_2d
from solrl_core.precision.hardware import FP8_BACKENDS, GpuInfo
from solrl_core.precision.quantize import WRAPPERS, QuantizedGemm

DEFAULT_FP8_BACKEND = FP8_BACKENDS[0]

# (precision, backend) -> {compute capability: where its figure is}. Figures of one denoising step
# against compiled bf16 on the same GPU; the explore step of torchao's fp8 was timed eager only.
_H100 = "docs/BENCHMARKS.md (H100, 2026-11-24)"
MEASURED: dict[tuple[str, str], dict[tuple[int, int], str]] = {
    ("fp8", "scaled_mm"): {(9, 0): _H100},
    ("bf16", "torch"): {(9, 0): _H100},
    ("nvfp4-emulated", "emulation"): {(9, 0): _H100},
}

_KERNELS = {
    ("fp8", "scaled_mm"): "solrl's torch._scaled_mm wrapper, row-wise e4m3",
    ("fp8", "torchao"): "torchao Float8Tensor, PerRow dynamic",
    ("nvfp4", "torchao"): "torchao NVFP4Tensor, torch._scaled_mm on float4",
    ("nvfp4-emulated", "emulation"): "torch, numerics only",
    ("fp8-e5m2-tensor", "emulation"): "torch, numerics only",
}


@dataclass(frozen=True)
class Backend:
    """What runs one explore precision on one device, and whether its speed is known there."""

    precision: str
    name: str  # scaled_mm | torchao | emulation | torch
    kernel: str
    measured: str  # where the figure is; '' when none exists for this device
    on_gpu: bool = True

    def describe(self, speed: bool = True) -> str:
        """'PRECISION -> NAME (KERNEL), SPEED'; without the speed where the caller says it once for all."""
        said = (f"measured, {self.measured}" if self.measured else "unmeasured on this GPU" if self.on_gpu
                else "no speed figure on a CPU")
        return f"{self.precision} -> {self.name} ({self.kernel})" + (f", {said}" if speed else "")


def backend_of(precision: str, gpu: GpuInfo | None, fp8_backend: str = DEFAULT_FP8_BACKEND) -> Backend:
    """The backend `precision` runs on `gpu` (None: the CPU), `fp8_backend` for fp8."""
    name = {"fp8": fp8_backend, "nvfp4": "torchao"}.get(precision)
    if name is None:
        name = "torch" if precision in ("bf16", "fp32") else "emulation"
    kernel = _KERNELS.get((precision, name), f"the model's own {precision} GEMMs")
    measured = MEASURED.get((precision, name), {}).get(gpu.capability, "") if gpu is not None else ""
    return Backend(precision, name, kernel, measured, gpu is not None)


def speed_note(precision: str, gpu: GpuInfo | None, fp8_backend: str = DEFAULT_FP8_BACKEND) -> str:
    """'' where a figure exists on this GPU, else what the start-up line adds: a real low-precision
    kernel whose speed nobody has timed here is said to be so."""
    b = backend_of(precision, gpu, fp8_backend)
    return "" if b.measured or gpu is None or b.name in ("emulation",
                                                         "torch") else f"{b.name} backend, unmeasured on this GPU"


class _Nvfp4(QuantizedGemm):
    """Real NVFP4 GEMMs (precision/nvfp4_gemm.py): the weight packed once per refresh (16x16 tiles),
    the input quantized on every call (1x16 blocks); torchao's NVFP4Tensor, torch._scaled_mm on float4."""

    PRECISION = "nvfp4"
    CACHES = ("weight_packed", "weight_block_scale", "weight_s_enc")
    # K % 32: two E2M1 codes a byte halve the reduction dim (torchao 0.18 prototype/mx_formats/kernels.py:159-164,
    # pack_uint4), and torch._scaled_mm wants the packed operands' dims multiples of 16 (torch 2.14
    # _meta_registrations.py:7168-7175; torchao's own check, inference_workflow.py:248, asks only 16).
    # A layer with K % 32 == 16 stays in high precision, its reason in quantization_report.json.
    K_MULTIPLE = 32
    weight_packed: Tensor
    weight_block_scale: Tensor
    weight_s_enc: Tensor

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        c = nvfp4_gemm.quantize_weight(weight.detach().reshape(weight.shape[0], -1))
        return {"weight_packed": c["packed"], "weight_block_scale": c["scale"], "weight_s_enc": c["s_enc"]}

    def gemm(self, x: Tensor) -> Tensor:
        return nvfp4_gemm.linear(x, self.weight_packed, self.weight_block_scale, self.weight_s_enc, self.bias)


class _KernelOrderNvfp4(QuantizedGemm):
    """`nvfp4-emulated` with explore.nvfp4_emulation=torchao: solrl's exact quantizer, the GEMM in the real
    `nvfp4` kernel's order (nvfp4_gemm.kernel_order_linear: output in the input's dtype, times the two
    per-tensor decode scales' product rounded to it), so emulation and kernel agree bit for bit."""

    PRECISION = "nvfp4-emulated"
    CACHES = ("weight_codes", "weight_block_scale", "weight_s_enc")
    weight_codes: Tensor
    weight_block_scale: Tensor
    weight_s_enc: Tensor

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        codes, scales, s_enc = quantize_2d(weight.detach().reshape(weight.shape[0], -1))
        return {"weight_codes": codes, "weight_block_scale": scales, "weight_s_enc": s_enc.reshape(1)}

    def gemm(self, x: Tensor) -> Tensor:
        return nvfp4_gemm.kernel_order_linear(x, self.weight_codes, self.weight_block_scale, self.weight_s_enc,
                                              self.bias)


class KernelOrderNvfp4Linear(_KernelOrderNvfp4):
    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return self.gemm(x)


class KernelOrderNvfp4Conv1x1(_KernelOrderNvfp4):
    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        return _channels_as_tokens(self.gemm, x)


class _TorchaoFp8(QuantizedGemm):
    """fp8 through torchao's Float8Tensor (PerRow weight and activation), as
    Float8DynamicActivationFloat8WeightConfig builds it, its caches plain tensors so a refresh writes
    them in place. torchao rounds a bf16 row's scale amax / 448 to bf16 where solrl's wrapper keeps
    it in fp32: same codes for fp32 inputs, within an E4M3 step for bf16 ones (tests/test_backends.py)."""

    PRECISION = "fp8"
    CACHES = ("weight_q", "weight_scale")
    weight_q: Tensor
    weight_scale: Tensor

    @staticmethod
    def _settings() -> tuple[Any, Any]:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs

        config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
        act = QuantizeTensorToFloat8Kwargs(config.activation_dtype, config.granularity[0],
                                           kernel_preference=config.kernel_preference)
        return config, act

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

        config, act = self._settings()
        w = Float8Tensor.from_hp(weight.detach().reshape(weight.shape[0], -1), float8_dtype=config.weight_dtype,
                                 granularity=config.granularity[1], mm_config=config.mm_config,
                                 kernel_preference=config.kernel_preference, act_quant_kwargs=act)
        return {"weight_q": w.qdata, "weight_scale": w.scale}

    @torch.no_grad()
    def requantize(self, weight: Tensor | None = None) -> None:
        super().requantize(weight)
        self._float8_weight(self.weight.dtype)  # here, outside any compiled region

    def _apply(self, fn: Any, recurse: bool = True) -> "_TorchaoFp8":
        self.__dict__.pop("_weight_f8", None)  # a move or cast replaces the caches: rebuilt on the next call
        return super()._apply(fn, recurse)

    def _float8_weight(self, dtype: torch.dtype) -> Tensor:
        """The caches as torchao's Float8Tensor, built once and kept outside the module's registry:
        built inside forward, the subclass would break the compiled graph there (Dynamo cannot trace
        its constructor), and the input's quantization could no longer fuse into the kernel before it.
        It holds the cache tensors themselves, so an in-place refresh reaches it; it is rebuilt when
        a refresh or a move replaces them."""
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

        w = self.__dict__.get("_weight_f8")
        if w is None or w.qdata is not self.weight_q or w.scale is not self.weight_scale or w.dtype != dtype:
            config, act = self._settings()
            w = Float8Tensor(self.weight_q, self.weight_scale, block_size=[1, self.weight_q.shape[1]],
                             mm_config=config.mm_config, act_quant_kwargs=act,
                             kernel_preference=config.kernel_preference, dtype=dtype)
            self.__dict__["_weight_f8"] = w
        return w

    def gemm(self, x: Tensor) -> Tensor:
        import torch.nn.functional as F

        return F.linear(x, self._float8_weight(x.dtype), self.bias)


def _channels_as_tokens(gemm: Any, x: Tensor) -> Tensor:
    """A 1x1 conv as a token GEMM over channels: a channels-last producer's NCHW view is read, and the
    output written, without a copy (as fp8's Fp8Conv1x1)."""
    return gemm(x.movedim(-3, -1)).movedim(-1, -3)


class Nvfp4Linear(_Nvfp4):
    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return self.gemm(x)


class Nvfp4Conv1x1(_Nvfp4):
    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        return _channels_as_tokens(self.gemm, x)


class TorchaoFp8Linear(_TorchaoFp8):
    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return self.gemm(x)


class TorchaoFp8Conv1x1(_TorchaoFp8):
    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        return _channels_as_tokens(self.gemm, x)


QUANTIZED = (*WRAPPERS, "nvfp4")  # the explore precisions whose copy wraps its GEMM layers


def wrappers_for(precision: str, fp8_backend: str = DEFAULT_FP8_BACKEND, nvfp4_emulation: str = "exact") -> tuple[type,
                                                                                                                  type]:
    """(Linear wrapper, 1x1-conv wrapper) of `precision` with `fp8_backend` for fp8 and `nvfp4_emulation`
    for nvfp4-emulated (quantize.quantize_model's `wrappers`)."""
    if precision == "nvfp4":
        return Nvfp4Linear, Nvfp4Conv1x1
    if precision == "nvfp4-emulated" and nvfp4_emulation == "torchao":
        return KernelOrderNvfp4Linear, KernelOrderNvfp4Conv1x1
    if precision == "fp8" and fp8_backend == "torchao":
        return TorchaoFp8Linear, TorchaoFp8Conv1x1
    return WRAPPERS[precision]

