"""scripts/pretrain_tiny.py: one script pre-trains either tiny world (`--world image|video`); the same
command writes the same bytes, and a snapshot is what the world's loader loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from solrl_core.config.schema import ModelConfig
from solrl_core.models import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pretrain_tiny.py"


@pytest.fixture(scope="module")
def pretrain():
    spec = importlib.util.spec_from_file_location("pretrain_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture
def keep_threads():
    """The script sets torch's thread count (--threads); the tests after this one keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("world", "loader"), [("image", "tiny"), ("video", "tiny_video")])
def test_one_script_pretrains_each_world_reproducibly_into_weights_its_loader_loads(pretrain, tmp_path, keep_threads,
                                                                                   world, loader):
    command = ["--world", world, "--steps", "2", "--batch", "2", "--save-every", "1", "--warmup", "1", "--threads", "2"]
    pretrain.main([*command, "--out", str(tmp_path / "a")])
    pretrain.main([*command, "--out", str(tmp_path / "b")])
    first, last = tmp_path / "a" / "step_00001", tmp_path / "a" / "step_00002"
    assert (last / "model.safetensors").read_bytes() == (tmp_path / "b" / "step_00002"
                                                         / "model.safetensors").read_bytes()
    saved = load_file(str(last / "model.safetensors"))
    # it trained
    assert any(not torch.equal(v, saved[k]) for k, v in load_file(str(first / "model.safetensors")).items())

    w = pretrain.SETUPS[world].world
    model = load_model(ModelConfig(loader=loader, weights=str(last), resolution=w.size, frames=w.frames),
                       torch.device("cpu"), torch.float32)
    assert f"weights {last}" in model.description and model.vocabulary == w.vocab and model.frames == w.frames
    loaded = model.transformer.state_dict()
    assert all(torch.equal(loaded[k[len("transformer."):]], v) for k, v in saved.items()
               if k.startswith("transformer."))
