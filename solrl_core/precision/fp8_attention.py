"""FP8 attention for the explore copy (explore.fp8_attention): Q, K and V quantized to E4M3 with one
scale per (batch, head), then attention. Off by default: no rank check and no GPU timing have shown
it pays yet.

Two kernels, one scale rule (torchao's prototype/attention/quantization/triton_qkv_quantization.py):
amax over a head's tokens and channels, in fp32; scale = 448 / amax and descale = amax / 448, both 1
where amax <= 1e-12; the codes are (x * scale) cast to float8_e4m3fn; with grouped-query attention
each group of query heads shares one scale.
- on a CPU: `emulated_sdpa`, that quantization exactly, the codes dequantized (code * descale, fp32)
  and fed to torch's own SDPA in fp32. It reproduces the input rounding, is not fast, and does not
  model what the fused kernel rounds inside (FA3 keeps the softmax probabilities in E4M3 for P.V).
- on compute capability 9.x with flash-attn's FA3 (`flash_attn_interface`), torch >= 2.11 and torchao:
  torchao's FP8 FA3 (`apply_low_precision_attention`), its SDPA replacement taken and the global
  pre-grad fusion pass it installs put back, so no other model's compiled graph is rewritten.

Which models: full attention over the image (or video) tokens, the loaders below; on a GPU not
Qwen-Image nor Z-Image, which mask their padded caption tokens (torchao's FA3 path takes no mask). SANA's
self-attention is linear; its only SDPA is the cross-attention to ~300 text tokens, a small share
of the step, so quantizing it would add rounding for little time and SANA is refused.
Which copies: any quantized explore copy. On a GPU FA3 runs only on Hopper, where fp8 is the real
GEMM precision; on a CPU the emulated GEMM precisions let the rank check see attention's own cost.

The swap is for the explore copy's forward only (`swapped`): torch.nn.functional's SDPA is replaced
while that forward runs and restored after it, as torchao's own wrapper does; diffusers looks the
function up at each call, and torch.compile guards on it, so graphs compiled outside keep SDPA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from solrl_core.errors import SolrlError

E4M3_MAX = 448.0
EPS = 1e-12  # torchao's: a head whose amax is at most this keeps scale 1
FULL_ATTENTION = ("flux1", "flux2", "sd3", "qwen_image", "zimage", "wan", "tiny_video")  # model.loader
FULL_PRECISION = ("bf16", "fp32")
MASKED = ("qwen_image", "zimage")  # pass a caption mask to attention, which torchao's FP8 FA3 refuses
_SDPA = F.scaled_dot_product_attention  # the original, whatever is swapped in later


def scales(x: Tensor, groups: int = 1) -> tuple[Tensor, Tensor]:
    """(scale, descale) of `x` [..., H, S, D], one per leading index and head (per group of `groups`
    consecutive heads), shaped [..., H // groups, 1, 1], fp32."""
    amax = x.detach().abs().float().amax(dim=(-2, -1), keepdim=True)
    if groups > 1:
        amax = amax.unflatten(-3, (-1, groups)).amax(dim=-3)
    ok = amax > EPS
    one = torch.ones_like(amax)
    return torch.where(ok, E4M3_MAX / amax, one), torch.where(ok, amax / E4M3_MAX, one)


def quantize(x: Tensor, groups: int = 1) -> tuple[Tensor, Tensor]:
    """(E4M3 codes, descale) of `x` [..., H, S, D] under torchao's per-(batch, head) rule."""
    scale, descale = scales(x, groups)
    if groups > 1:
        scale = scale.repeat_interleave(groups, dim=-3)
    return (x.float() * scale).to(torch.float8_e4m3fn), descale


def fake_quantize(x: Tensor, groups: int = 1) -> Tensor:
    """`x` as the FP8 kernel sees it: its codes times their descale, fp32."""
    codes, descale = quantize(x, groups)
    if groups > 1:
        descale = descale.repeat_interleave(groups, dim=-3)
    return codes.float() * descale


def emulated_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """F.scaled_dot_product_attention with Q, K and V rounded to E4M3 first (module docstring), in fp32,
    the result in the query's dtype."""
    groups = query.shape[-3] // key.shape[-3] if enable_gqa else 1
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.float()
    out = _SDPA(fake_quantize(query, groups), fake_quantize(key), fake_quantize(value), attn_mask=attn_mask,
                dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return out.to(query.dtype)


@contextlib.contextmanager
def swapped(kernel: Callable[..., Tensor]) -> Iterator[None]:
    """torch.nn.functional.scaled_dot_product_attention is `kernel` inside, the original again after
    (also after an error); torchao's FA3 kernel also has flash attention's FA3 implementation active."""
    flash = getattr(kernel, "flash_impl", "")
    if flash:
        from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl

        activate_flash_attention_impl(flash)
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = kernel
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
        if flash:
            restore_flash_attention_impl()


class Swap:
    """FP8 attention for `module`'s forwards only: a forward pre-hook swaps the kernel in (`swapped`)
    and a forward hook that runs also when the forward raises swaps it out; the module itself, its
    parameters and its state_dict keys stay as they are. The kernel follows the input's device."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.enabled = True
        self._kernels: dict[str, Callable[..., Tensor]] = {}
        self._active: contextlib.ExitStack | None = None
        # forwards in flight: CPU lanes (runtime/lanes.py) run several at once, and the kernel stays
        # swapped in until the last of them ends, not the first
        self._inside = 0
        self._lock = threading.Lock()
        self._counted = threading.local()  # .depth: this thread's forwards of the module in flight
        module.register_forward_pre_hook(self._enter, with_kwargs=True)
        module.register_forward_hook(self._exit, always_call=True)

    def _enter(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.enabled:
            return
        depth = getattr(self._counted, "depth", 0)
        if depth:  # a forward of this thread already counted
            self._counted.depth = depth + 1
            return
        device = next(t.device for t in (*args, *kwargs.values()) if isinstance(t, Tensor))
        self._counted.depth = 1
        with self._lock:
            self._inside += 1
            if self._active is None:
                if device.type not in self._kernels:
                    self._kernels[device.type] = kernel_for(device)
                stack = contextlib.ExitStack()
                stack.enter_context(swapped(self._kernels[device.type]))
                self._active = stack

    def _exit(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        depth = getattr(self._counted, "depth", 0)
        if depth == 0:
            return
        self._counted.depth = depth - 1
        if depth > 1:
            return
        with self._lock:
            self._inside -= 1
            active = self._active if self._inside == 0 else None
            if active is not None:
                self._active = None
        if active is not None:
            active.close()

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """The module's own attention inside."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True


def fa3_missing(capability: tuple[int, int] | None) -> str:
    """Why torchao's FP8 FA3 cannot run on a GPU of `capability` here ('' when it can; None: the CPU)."""
    if capability is None:
        return "no GPU: FP8 FA3 needs an NVIDIA GPU of compute capability 9.x (Hopper)"
    if capability[0] != 9:
        return f"compute capability {capability[0]}.{capability[1]} is not 9.x: torchao's FP8 FA3 runs on Hopper only"
    missing = []
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 11):
        missing.append(f"torch >= 2.11 (this is {torch.__version__})")
    for module, what in (("torchao", "torchao (pip install torchao)"),
                         ("flash_attn_interface", "flash-attn's FA3 build (flash_attn_interface, from "
                                                  "flash-attention/hopper)")):
        if importlib.util.find_spec(module) is None:
            missing.append(what)
    return "missing " + ", ".join(missing) if missing else ""


def backend(capability: tuple[int, int] | None) -> tuple[str, str]:
    """(name, what) of the attention kernel explore.fp8_attention uses on such a GPU (None: the CPU):
    name is 'emulation', 'torchao-fa3', or '' when none runs there (what then says why)."""
    if capability is None:
        return "emulation", "torch, Q/K/V rounded to E4M3 then SDPA: numerics only, not fast"
    missing = fa3_missing(capability)
    return ("", missing) if missing else ("torchao-fa3", "torchao FP8 FA3, per-(batch, head) E4M3 Q/K/V")


def require(precision: str, loader: str, device: Any) -> None:
    """Refuse explore.fp8_attention where it cannot apply: a full-precision explore copy, a model
    without full attention, or a CUDA device that cannot run FP8 FA3 (named)."""
    off = "or set explore.fp8_attention=false"
    if precision in FULL_PRECISION:
        raise SolrlError(f"explore.fp8_attention quantizes a low-precision explore copy's attention, and the explore "
                         f"precision here is {precision}", "use a family with a low-precision explore copy (sol_rl, "
                         f"naive_quant) at a low explore precision (fp8 on Hopper), {off}")
    if loader not in FULL_ATTENTION:
        raise SolrlError(f"explore.fp8_attention is for models with full attention over the image tokens, and "
                         f"model.loader={loader} has none (SANA's self-attention is linear)",
                         f"use it with {', '.join(FULL_ATTENTION[:-1])} {off}")
    device = torch.device(device)
    if device.type == "cuda":
        missing = fa3_missing(torch.cuda.get_device_capability(device))
        if missing:
            raise SolrlError(f"explore.fp8_attention cannot run on {device}: {missing}",
                             f"run on a Hopper GPU with those installed, {off}")
        if loader in MASKED:
            raise SolrlError(f"explore.fp8_attention on {device} is torchao's FP8 FA3, which takes no attention mask, "
                             f"and model.loader={loader} masks its padded caption "
                             f"tokens", f"use it with FLUX.1, SD3 or Wan, {off}")


def kernel_for(device: torch.device) -> Callable[..., Tensor]:
    """The SDPA replacement on `device` (`require` has passed): the emulation on a CPU, torchao's FP8
    FA3 on CUDA."""
    if device.type != "cuda":
        return emulated_sdpa
    import torch._inductor.config as inductor_config
    from torchao.prototype.attention.api import AttentionBackend, apply_low_precision_attention

    fusion = inductor_config.pre_grad_custom_pass
    # a module without parameters: torchao's causal-mask probe does not run (a diffusion transformer is not causal)
    try:
        wrapper = apply_low_precision_attention(torch.nn.Identity(), backend=AttentionBackend.FP8_FA3)
    finally:
        inductor_config.pre_grad_custom_pass = fusion  # global: it would rewrite the trained model's graphs too
    fa3 = wrapper._sdpa_patch_fn
    fa3.flash_impl = wrapper._flash_impl_name  # what `swapped` activates around the forward, as torchao's wrapper does
    return fa3
