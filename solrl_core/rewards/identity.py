"""What a reward server serves, and whether it is still what a run trained against.

The server states its identity (GET /info, and in /health): its name and solrl version, and per
reward its name, weight and a fingerprint: for a built-in reward, SHA-256 over its weights (every
tensor of every torch module it holds, by name, dtype, shape and bytes), or, without weights (the
tiny world's, the JPEG ones), over its name and the solrl version that implements it; for a plugin
(rewards/plugins.py), SHA-256 over its name, its code (plugins.fingerprint: the qualified name and
a hash of the source file that defines it) and the weights it holds (the modules of the plugin's
instance too), so a plugin file edited to score otherwise is another reward, whatever its name. The
server's own fingerprint covers the list of them.

A run records the identity of each `remote:` server in `reward_servers.json` beside config.toml when
it first contacts it. On --resume a server whose fingerprint changed is refused, as a changed LoRA
rank is (`reward.remote.on_change=warn`: a warning, and the run goes on against the new one).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.io.atomic import write_atomic

RECORD_FILE = "reward_servers.json"
ON_CHANGE = ("refuse", "warn")


def weights_fingerprint(reward: Any) -> str:
    """SHA-256 over every tensor of the torch modules `reward` holds ('' when it holds none); for a
    plugin, those of the instance it created too."""
    held = dict(vars(reward)) if hasattr(reward, "__dict__") else {}
    inner = held.get("fn")  # a plugin (plugins.PluginReward): the object it calls may hold the weights
    if hasattr(inner, "__dict__") and not isinstance(inner, torch.nn.Module):
        held.update({f"fn.{k}": v for k, v in vars(inner).items()})
    modules = sorted((k, v) for k, v in held.items() if isinstance(v, torch.nn.Module))
    if not modules:
        return ""
    digest = hashlib.sha256()
    for attr, module in modules:
        for key, tensor in sorted(module.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{attr}.{key}:{t.dtype}:{tuple(t.shape)}\n".encode())
            # 0-dim too (logit_scale)
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def server_identity(rewards: dict[str, Any], weights: dict[str, float], version: str) -> dict[str, Any]:
    """The identity a server states: its name, version, and each reward's name, weight and fingerprint."""
    served = [{"name": name, "weight": weights[name], "fingerprint": reward_fingerprint(name, reward, version)}
              for name, reward in rewards.items()]
    whole = hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()
    return {"name": "solrl reward-server", "version": version, "rewards": served, "fingerprint": whole}


def reward_fingerprint(name: str, reward: Any, version: str) -> str:
    """What one served reward is (see the module docstring): its code and weights."""
    code = getattr(reward, "fingerprint", None)  # a plugin's code (plugins.fingerprint)
    if isinstance(code, str):
        return hashlib.sha256(f"{name}\n{code}\n{weights_fingerprint(reward)}".encode()).hexdigest()
    return weights_fingerprint(reward) or hashlib.sha256(f"{name}\n{version}".encode()).hexdigest()


def describe(identity: dict[str, Any]) -> str:
    rewards = ", ".join(f"{r.get('name')}={r.get('weight'):g}" if isinstance(r.get("weight"), (int, float))
                        else str(r.get("name"))
                        for r in identity.get("rewards", []) if isinstance(r, dict))
    return (f"{rewards or 'nothing named'} (solrl {identity.get('version')}, fingerprint "
            f"{str(identity.get('fingerprint'))[:12]})")


def _served_names(identity: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(name, weight) of each reward an identity lists."""
    listed = identity.get("rewards")
    return [(r.get("name"), r.get("weight")) for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []


def _served(rewards: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The identity of each remote: reward of a run that stated one, by reward name."""
    return {name: r.identity for name, r in rewards.items() if isinstance(getattr(r, "identity", None), dict)}


def _read(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RECORD_FILE
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # a record nested too deep is unreadable too
        raise SolrlError(f"{path} is unreadable ({type(exc).__name__}: {exc})",
                         f"delete it to record the servers afresh (rm {path}), if they still serve what the run "
                         f"trained against")
    return record if isinstance(record, dict) else {}


def check_servers(run_dir: Path, rewards: dict[str, Any], on_change: str = "refuse") -> list[str]:
    """On resume: each remote: server against the identity the run recorded. A changed one is a
    SolrlError, or (on_change 'warn') a warning returned for the run's notes."""
    record, notes = _read(run_dir), []
    for name, now in _served(rewards).items():
        before = record.get(name)
        if not isinstance(before, dict) or before.get("fingerprint") == now.get("fingerprint"):
            continue
        message = f"{name} now serves {describe(now)}, not {describe(before)} as when this run trained against it"
        if _served_names(now) == _served_names(before):
            message = (f"the server's reward changed since this run started: {name} serves {describe(now)}, the same "
                       f"names with other code or weights (fingerprint {str(before.get('fingerprint'))[:12]} when the "
                       f"run began)")
        if on_change == "warn":
            notes.append(f"{message}; going on (reward.remote.on_change=warn)")
            continue
        raise SolrlError(message, "serve the run's reward behind that URL again (a plugin's file as it was), or go on "
                                  "against the new one with --set reward.remote.on_change=warn")
    return notes


def record_servers(run_dir: Path, rewards: dict[str, Any]) -> None:
    """Write what each remote: server serves now into the run folder (other entries kept)."""
    served = _served(rewards)
    if served:
        write_atomic(run_dir / RECORD_FILE, json.dumps({**_read(run_dir), **served}, indent=2, sort_keys=True))
