"""The trained policy: one base transformer carrying two peft LoRA adapters.

`default` is trained; `old` is the lagged rollout policy (old <- d*old + (1-d)*default after each
step); the reference policy is the base with adapters disabled. One base, no full copies, so a
12B model fits once. An EMA of `default` is kept for evaluation only.

The adapters are fp32 whatever the base dtype, as the official code gets them from peft's
`get_peft_model` / `add_adapter` (`autocast_adapter_dtype=True`): so are the EMA and AdamW's moments.
In bf16 a LoRA weight's rounding step is about as large as one Adam step at lr 3e-4, so bf16 adapters
would lose most updates. The base stays in the run dtype; autocast runs the mixed matmuls.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Iterable, Iterator

import torch
from peft import LoraConfig
from peft.tuners.tuners_utils import BaseTunerLayer, cast_adapter_dtype
from peft.utils import get_peft_model_state_dict
from torch import nn

from solrl_core.config.choices import LORA_INITS
from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.runtime import distributed

TRAINED, OLD = "default", "old"
LORA_FILE = "pytorch_lora_weights.safetensors"


class Policy:
    def __init__(self, transformer: nn.Module, cfg: ModelConfig) -> None:
        self.transformer = transformer
        self.loader = cfg.loader
        self.lora_config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                      init_lora_weights=LORA_INITS[cfg.lora_init],
                                      target_modules=list(cfg.lora_targets))
        transformer.requires_grad_(False)
        try:
            with warnings.catch_warnings():  # peft warns that a second adapter is a second adapter
                warnings.simplefilter("ignore", UserWarning)
                transformer.add_adapter(self.lora_config, adapter_name=TRAINED)
                transformer.add_adapter(self.lora_config, adapter_name=OLD)
            for name in (TRAINED, OLD):  # diffusers' add_adapter creates them in the base dtype; peft's own cast
                cast_adapter_dtype(transformer, name, autocast_adapter_dtype=True)
        except ValueError as exc:
            raise SolrlError(f"LoRA targets {list(cfg.lora_targets)} match no module of the model: {exc}",
                             "set model.lora_targets to module-name suffixes of the transformer") from exc
        self.layers = [m for m in transformer.modules() if isinstance(m, BaseTunerLayer)]
        self._params = {name: dict(self._adapter_params(name)) for name in (TRAINED, OLD)}
        with torch.no_grad():
            for key, p in self._params[OLD].items():
                p.copy_(self._params[TRAINED][key])
        self._activate(TRAINED)
        self.ema = {k: p.detach().clone() for k, p in self._params[TRAINED].items()}

    def rebind(self) -> None:
        """Point at the transformer's parameters again after FSDP replaced them by sharded ones
        (sharding.py); the EMA keeps this rank's shard of its values."""
        self._params = {name: dict(self._adapter_params(name)) for name in (TRAINED, OLD)}
        self.ema = {k: distributed.shard_like(self.ema[k], p.detach()) for k, p in self._params[TRAINED].items()}
        self._activate(TRAINED)

    def _adapter_params(self, adapter: str) -> Iterator[tuple[str, nn.Parameter]]:
        tag = f".{adapter}."
        for name, p in self.transformer.named_parameters():
            if tag in name and "lora_" in name:
                yield name.replace(tag, "."), p

    def _activate(self, adapter: str | None) -> None:
        for layer in self.layers:
            if adapter is None:
                layer.enable_adapters(False)
            else:
                layer.enable_adapters(True)
                layer.set_adapter(adapter)
        # Only the trained adapter ever takes gradients, whatever is active.
        for p in self._params[OLD].values():
            p.requires_grad_(False)
        for p in self._params[TRAINED].values():
            p.requires_grad_(True)

    @contextlib.contextmanager
    def use(self, adapter: str | None) -> Iterator[nn.Module]:
        """Run the transformer as `default`, `old`, or the reference (None: adapters disabled)."""
        self._activate(adapter)
        try:
            yield self.transformer
        finally:
            self._activate(TRAINED)

    @contextlib.contextmanager
    def weights(self, which: str) -> Iterator[nn.Module]:
        """The transformer as `base` (no adapter), `trained` (the live adapter) or `ema` (the EMA
        swapped into the trained adapter's slot for the duration, then restored exactly)."""
        if which == "base":
            with self.use(None) as net:
                yield net
            return
        if which == "trained":
            with self.use(TRAINED) as net:
                yield net
            return
        if which != "ema":
            raise ValueError(f"unknown weights {which}")
        live = self.state(TRAINED)
        self.load_state(TRAINED, self.ema)
        try:
            with self.use(TRAINED) as net:
                yield net
        finally:
            self.load_state(TRAINED, live)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self._params[TRAINED].values())

    @torch.no_grad()
    def update_old(self, decay: float) -> None:
        """old <- decay * old + (1 - decay) * default."""
        for key, old in self._params[OLD].items():
            old.mul_(decay).add_(self._params[TRAINED][key], alpha=1 - decay)

    @torch.no_grad()
    def update_ema(self, decay: float) -> None:
        for key, p in self._params[TRAINED].items():
            self.ema[key].mul_(decay).add_(p.detach(), alpha=1 - decay)

    def state(self, adapter: str) -> dict[str, torch.Tensor]:
        """Adapter tensors keyed without the adapter name ('...to_q.lora_A.weight'), whole (sharded ones
        gathered: then every rank calls this)."""
        source = self.ema if adapter == "ema" else self._params[adapter]
        return {k: distributed.full_tensor(v.detach()).cpu().clone() for k, v in source.items()}

    @torch.no_grad()
    def load_state(self, adapter: str, state: dict[str, torch.Tensor]) -> None:
        target = self.ema if adapter == "ema" else self._params[adapter]
        if set(state) != set(target):
            raise SolrlError(f"saved '{adapter}' adapter does not match this model ({len(set(state) ^ set(target))} "
                             f"keys differ)",
                             "resume with the same model and LoRA settings the run was started with")
        for key, value in state.items():  # whole tensors; a sharded target keeps this rank's shard
            target[key].copy_(distributed.shard_like(value, target[key]))

    @staticmethod
    def adapted(modules: Iterable[tuple[str, nn.Module]], adapter: str = OLD) -> list[tuple[str, nn.Module]]:
        """The (name, layer) pairs among `modules` that carry `adapter`."""
        return [(n, m) for n, m in modules if isinstance(m, BaseTunerLayer) and adapter in m.lora_A]

    @torch.no_grad()
    def merged_weights(self, adapter: str = OLD, layers: list[tuple[str, nn.Module]] | None = None) -> dict[str,
            torch.Tensor]:
        """Base weight + scale * B @ A of every adapted layer (or of `layers`, from `adapted`), keyed as
        in the plain base model, summed in fp32 and returned in the base weight's dtype."""
        out = {}
        for name, module in self.adapted(self.transformer.named_modules(), adapter) if layers is None else layers:
            base = module.get_base_layer().weight
            out[f"{name}.weight"] = (base.float() + module.get_delta_weight(adapter).float()).to(base.dtype)
        return out

    def save_lora(self, directory: str | Path, adapter: str = TRAINED,
                  state: dict[str, torch.Tensor] | None = None) -> Path:
        """Write the adapter as diffusers' `pipe.load_lora_weights(directory)` reads it, through the
        model's own pipeline class (the tiny model is a SANA). `state`: the adapter's tensors as
        `state(adapter)` gives them, gathered beforehand where the policy is sharded."""
        import diffusers

        from solrl_core.models.layouts import LAYOUTS

        pipeline = getattr(diffusers, LAYOUTS[self.loader].pipeline if self.loader in LAYOUTS else "SanaPipeline")

        if state is not None:
            state = dict(state)
        elif adapter == "ema":
            state = {k: v.clone() for k, v in self.ema.items()}
        else:
            state = get_peft_model_state_dict(self.transformer, adapter_name=adapter)
        metadata = {k: (sorted(v) if isinstance(v, set) else v) for k, v in self.lora_config.to_dict().items()}
        pipeline.save_lora_weights(str(directory), transformer_lora_layers=state, safe_serialization=True,
                                       transformer_lora_adapter_metadata=metadata)
        return Path(directory) / LORA_FILE
