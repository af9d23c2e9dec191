"""Weights parked on the CPU between the phases that use them: two memory modes (memory_modes.py).

- `memory.copies = cpu-whole | cpu-blocks`: the explore and rollout copies (rollout.RolloutCopy) live
  on the CPU. `on_device(copy)` brings one in for the phase that runs on it (Stage 1, Stage 2, the rank
  check, the update's v_old, a refresh): cpu-whole moves it whole and back after; cpu-blocks leaves
  the root's own layers (embedders, final layer: small) in for the phase and moves each repeated
  transformer block (regions.repeated_blocks) in just before its forward and out just after, so the
  GPU holds one block of the copy at a time but the whole copy crosses for every sampler step. A
  refresh re-quantizes on the GPU, unit by unit, so an fp8 copy keeps its GPU scaling (quantize.py).
  A compiled copy is compiled on the GPU and keeps its graphs across moves (the same device each time it
  runs); under cpu-blocks the copies run eager (a block's moves are module hooks, which a compiled block
  would trace), as the start-up line says.
- `memory.vae_on_cpu`: the VAE lives on the CPU and comes in for each `Engine.generate` or
  `Engine.decode` call (every rollout, evaluation and logged image), leaving after it.

A move keeps each Parameter object and moves its storage (`.data`), so whatever holds the parameter
sees it where it now is. Plain (pageable) CPU memory: pinned memory, which copies faster, is not used.
On a CPU run the run device is the CPU and every move is a no-op: the CPU tests check that these
modes give the same run as none, not the GPU bytes, which are estimated (footprint.py) and unmeasured.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn

from solrl_core.engine.regions import repeated_blocks

PARK = torch.device("cpu")


def move(modules: Iterable[nn.Module], device: torch.device) -> None:
    """Each module's own parameters and buffers (not its children's) to `device`, in place; meta
    tensors (the weights a copy built from shards never holds: sharded_copy.py) stay."""
    for m in modules:
        for p in m.parameters(recurse=False):
            if not p.is_meta and p.device != device:
                p.data = p.data.to(device)
        for name, b in list(m.named_buffers(recurse=False)):
            if not b.is_meta and b.device != device:
                m._buffers[name] = b.to(device)


class Units:
    """A module split into what moves together: each repeated block's modules, then the root's own."""

    def __init__(self, module: nn.Module) -> None:
        self.blocks = repeated_blocks(module)
        inside = {id(m) for b in self.blocks for m in b.modules()}
        self.root = [m for m in module.modules() if id(m) not in inside]

    def all(self) -> list[list[nn.Module]]:
        return [list(b.modules()) for b in self.blocks] + [self.root]


class Parking:
    """Where the copies and the VAE of an engine live between phases (module docstring)."""

    def __init__(self, device: torch.device, copies: str = "gpu", vae: nn.Module | None = None) -> None:
        self.device, self.copies, self.vae = device, copies, vae

    @property
    def parks_copies(self) -> bool:
        return self.copies in ("cpu-whole", "cpu-blocks")

    def park(self, modules: Iterable[nn.Module]) -> None:
        """Send `modules` (the copies, when the mode parks them) to the CPU."""
        if self.parks_copies:
            for module in modules:
                move(module.modules(), PARK)

    def park_vae(self) -> None:
        if self.vae is not None:
            self.vae.to(PARK)

    def units(self, module: nn.Module) -> Units:
        """Kept on the module itself, so a copy freed (a calibration's candidate) takes its units with it."""
        if not isinstance(getattr(module, "_parking_units", None), Units):
            module._parking_units = Units(module)
        return module._parking_units

    @contextlib.contextmanager
    def on_device(self, module: nn.Module) -> Iterator[None]:
        """A copy's module on the run device for the duration (module docstring); as it is when the
        copies stay on the GPU."""
        if not self.parks_copies:
            yield
            return
        units = self.units(module)
        if self.copies == "cpu-whole" or not units.blocks:
            move(module.modules(), self.device)
            try:
                yield
            finally:
                move(module.modules(), PARK)
            return
        move(units.root, self.device)
        hooks = []
        for block in units.blocks:
            inner = list(block.modules())
            hooks.append(block.register_forward_pre_hook(lambda _m, _a, inner=inner: move(inner, self.device)))
            hooks.append(block.register_forward_hook(lambda _m, _a, _o, inner=inner: move(inner, PARK)))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
            move(module.modules(), PARK)

    def unit_by_unit(self, module: nn.Module) -> Iterator[list[nn.Module]]:
        """Each unit of `module` on the device in turn (the whole module under cpu-whole or gpu), for a refresh."""
        if self.copies != "cpu-blocks":
            with self.on_device(module):
                yield list(module.modules())
            return
        for unit in self.units(module).all():
            move(unit, self.device)
            try:
                yield unit
            finally:
                move(unit, PARK)

    @contextlib.contextmanager
    def vae_in(self) -> Iterator[None]:
        """The VAE on the run device for a decode, when it is parked; re-entrant calls move it once."""
        if self.vae is None or next(self.vae.parameters()).device == self.device:
            yield
            return
        self.vae.to(self.device)
        try:
            yield
        finally:
            self.vae.to(PARK)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
