"""Rewards score a batch of images against their prompts: one float per image.

A reward is any object with a `name` and `__call__(images, prompts) -> Tensor[B]`, where images are
float tensors [B, 3, H, W] in [0, 1] on any device, and the result is a float32 CPU tensor. Model
rewards run on the context's device, in eval mode, under no_grad. Optionally a reward has
`check_prompts(prompts)` (rejects prompts it cannot score, called before a run writes anything) and
`summary(scores, prompts) -> dict` (named statistics for evaluations, e.g. GenEval-style strict
accuracy and the mean per kind of prompt) and `groups(prompts) -> {name: indices}` (the images behind
each per-group mean, so an evaluation can give each group's change a standard error).

Each built-in reward is declared once in rewards/registry.py (torch-free): how to build it from a
`RewardContext` (device, dtype, an optional local path for its weights, batch size), where its
weights come from, what it needs installed. User rewards are plugins (plugins.py): a callable or a
class of this same interface, named `mypkg.rewards:ocr`, `path/to/file.py:score`, or by an installed
package's `solrl.rewards` entry point (docs/rewards.md). Heavy backends are imported only when
built, so `import solrl_core` stays light.

This package imports torch only for what needs it: the registry (registry.py) and the reading of
reward names (names.py) are torch-free, so a config is checked and `solrl presets` lists the rewards
without torch; `RewardSet`, `Scores`, `build_reward`, `Reward` and `RewardContext` load their modules
on first use (PEP 562 `__getattr__` below).
"""

from __future__ import annotations

import importlib
from typing import Any

from solrl_core.rewards.names import check_names, is_weight_list, known_names, label, parse_weights
from solrl_core.rewards.registry import BUILTIN, BUILTINS, RewardInfo, lookup, registry

_LAZY = {"RewardSet": "reward_set", "Scores": "reward_set", "build_reward": "reward_set", "reward_names": "reward_set",
         "Reward": "base", "RewardContext": "base"}
__all__ = ["BUILTIN", "BUILTINS", "RewardInfo", "check_names", "is_weight_list", "known_names", "label", "lookup",
           "parse_weights", "registry", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"solrl_core.rewards.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'solrl_core.rewards' has no attribute '{name}'")
