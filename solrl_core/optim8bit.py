"""The update's optimizer: torch's AdamW, or with `memory.adamw_8bit` torchao's AdamW8bit (the `memory`
extra), whose two moments are uint8 codes with one fp32 scale per block of 256 values (tensors of
fewer than 4096 values, or not a multiple of 256, keep fp32 moments): about 2.03 bytes per adapter
parameter instead of 8 (footprint.ADAMW_BYTES). Its step computes in fp32 from the dequantized moments
and rounds the new moments to 8 bits, so it is AdamW up to that rounding, not exact.

torchao compiles its step (torch.compile, fullgraph): on CUDA as it ships; on a CPU this class runs the
same step function eagerly (`single_param_adam`), where compiling it took about 16 s per tensor shape
(2-core CPU, torch 2.14, torchao 0.18). Its checkpoints hold what torch's AdamW saves (fp32 moments,
a float learning rate): `state_dict` dequantizes, `load_state_dict` re-quantizes, so a checkpoint
written with either optimizer resumes with the other.
"""

from __future__ import annotations

from typing import Any

import torch

from solrl_core.config import OptimizerConfig
from solrl_core.errors import SolrlError

INSTALL = "pip install -e '.[memory]' (torchao), or --set memory.adamw_8bit=false"


def make_optimizer(params: list[torch.nn.Parameter], opt: OptimizerConfig, eight_bit: bool) -> torch.optim.Optimizer:
    """AdamW over `params` with the config's settings; its moments in 8 bits when `eight_bit`."""
    kwargs = dict(lr=opt.lr, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay, eps=opt.eps)
    if not eight_bit:
        return torch.optim.AdamW(params, **kwargs)
    return _eight_bit_class()(params, **kwargs)


def _eight_bit_class() -> type:
    try:
        from torchao.optim import AdamW8bit
        from torchao.optim.adam import single_param_adam
    except ImportError as exc:
        raise SolrlError(f"memory.adamw_8bit needs torchao, which does not import here ({exc})", INSTALL) from exc

    class PlainStateAdamW8bit(AdamW8bit):
        """torchao's AdamW8bit, eager on a CPU, saving and loading torch AdamW's state layout."""

        def __init__(self, params: Any, **kwargs: Any) -> None:
            super().__init__(params, **kwargs)
            self.lr_value = float(kwargs["lr"])  # saved as given: the group's fp32 tensor would round it

        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            if not any(p.is_cpu for g in self.param_groups for p in g["params"]):
                return super().step(closure)
            for group in self.param_groups:  # the parent's step without its torch.compile
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.tensor(0.0)
                        state["exp_avg"] = self._new_buffer(p, True)
                        state["exp_avg_sq"] = self._new_buffer(p, False)
                    state["step"] += 1
                    single_param_adam(p.detach(), p.grad, state["step"], state["exp_avg"], state["exp_avg_sq"], None,
                                      group["lr"], group["betas"][0], group["betas"][1], group["weight_decay"],
                                      group["eps"], True, False)
            return None

        def state_dict(self) -> dict[str, Any]:
            sd = super().state_dict()
            sd["state"] = {i: {k: _plain(v) for k, v in s.items()} for i, s in sd["state"].items()}
            for group in sd["param_groups"]:
                group["lr"] = self.lr_value
            return sd

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            super().load_state_dict(state_dict)
            for group in self.param_groups:
                group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32)
                for p in group["params"]:
                    state = self.state.get(p, {})
                    for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
                        if key in state and type(state[key]) is torch.Tensor:
                            buffer = self._new_buffer(p, signed)
                            buffer.copy_(state[key].to(buffer.device, torch.float32))
                            state[key] = buffer

    return PlainStateAdamW8bit


def _plain(value: Any) -> Any:
    """An 8-bit moment as an fp32 tensor (others as they are)."""
    if torch.is_tensor(value) and type(value) is not torch.Tensor and hasattr(value, "dequantize"):
        return value.dequantize().float()
    return value
