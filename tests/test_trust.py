"""A run folder from someone else: resuming it never runs code planted in it, and a malformed one
is refused with a clear line (docs/reliability.md, "Threats")."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.faults.manifest import MANIFEST, write_manifest
from solrl_core.faults.state_files import load_legacy, load_state, save_state
from tests.helpers import CKPT, copy_run as _copy
from tests.helpers import in_tmp, trained  # noqa: F401,F811  (fixtures, used by name)

runner = CliRunner()


class _Planted:
    """What an attacker pickles: loading it runs `code`."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (exec, (self.code,))


def _to_legacy(folder, rng=None) -> None:  # type: ignore[no-untyped-def]
    """Rewrite a checkpoint as one written before the plain format (optimizer.pt, rng.pt), with the
    manifest rewritten to match, as anyone who can write the folder can do."""
    optimizer, saved_rng = load_state(folder, "optimizer"), load_state(folder, "rng")
    for name in ("optimizer", "rng"):
        for ext in ("json", "safetensors"):
            (folder / f"{name}.{ext}").unlink()
    torch.save(optimizer, folder / "optimizer.pt")
    torch.save(saved_rng if rng is None else rng, folder / "rng.pt")
    write_manifest(folder)


@pytest.mark.slow
def test_resume_never_runs_a_pickle_planted_in_a_checkpoint(in_tmp, trained):
    _copy(trained, in_tmp / "r")
    folder = in_tmp.joinpath("r", *CKPT)
    marker = in_tmp / "planted-code-ran"
    _to_legacy(folder, rng=_Planted(f"open({str(marker)!r}, 'w').write('ran')"))
    assert MANIFEST in os.listdir(folder)  # the manifest matches: it is no defence against its writer
    env = {k: v for k, v in os.environ.items() if k != "SOLRL_DEBUG"}
    done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--resume", "r", "--iterations", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=in_tmp)
    assert not marker.exists(), "resume ran the planted code"
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refuses to load it" in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr


def test_a_checkpoint_holds_no_pickle(trained):
    folder = trained.joinpath(*CKPT)
    suffixes = {p.suffix for p in folder.rglob("*") if p.is_file()}
    assert suffixes == {".safetensors", ".json"}, suffixes
    for path in folder.rglob("*.safetensors"):
        load_file(str(path))  # each parses as safetensors


def test_a_checkpoint_of_the_old_format_still_resumes_and_continues_the_same(in_tmp, trained):
    _copy(trained, in_tmp / "new")
    _copy(trained, in_tmp / "old")
    _to_legacy(in_tmp.joinpath("old", *CKPT))
    for run in ("new", "old"):
        result = runner.invoke(app, ["train", "--resume", run, "--iterations", "2"])
        assert result.exit_code == 0, result.output
    new, old = (load_file(str(in_tmp / run / "checkpoints" / "iter_000002" / "pytorch_lora_weights.safetensors"))
                for run in ("new", "old"))
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)


def test_rng_and_optimizer_states_round_trip_exactly(tmp_path):
    torch.manual_seed(3)
    np.random.seed(4)
    random.seed(5)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(), "cuda": []}
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    opt.step()
    for name, obj in (("rng", rng), ("optimizer", opt.state_dict())):
        save_state(obj, tmp_path, name)
    back = load_state(tmp_path, "rng")
    assert torch.equal(back["torch"], rng["torch"]) and back["python"] == rng["python"]
    assert back["numpy"][0] == rng["numpy"][0] and np.array_equal(back["numpy"][1], rng["numpy"][1])
    assert back["numpy"][1].dtype == rng["numpy"][1].dtype and back["numpy"][2:] == rng["numpy"][2:]
    np.random.set_state(back["numpy"])  # accepted as numpy's own
    sd, sd_back = opt.state_dict(), load_state(tmp_path, "optimizer")
    assert sd_back["param_groups"] == sd["param_groups"] and sd_back["state"].keys() == sd["state"].keys()
    assert all(torch.equal(sd_back["state"][i][k], v) for i in sd["state"] for k, v in sd["state"][i].items())


def test_the_legacy_reader_refuses_anything_but_plain_data(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": _Planted(f"open({str(marker)!r}, 'w')")}, tmp_path / "rng.pt")
    with pytest.raises(Exception) as raised:
        load_legacy(tmp_path / "rng.pt")
    assert "refuses to load it" in str(raised.value.message) and not marker.exists()
    torch.save({"numpy": np.random.get_state(), "t": torch.ones(2)}, tmp_path / "ok.pt")
    assert np.array_equal(load_legacy(tmp_path / "ok.pt")["numpy"][1], np.random.get_state()[1])


@pytest.mark.parametrize("files", [[1, 2], {"../../etc/passwd": {"size": 1, "sha256": "x"}}, {"a": {"size": "1"}}])
def test_a_malformed_manifest_is_a_clear_refusal(in_tmp, trained, files):
    _copy(trained, in_tmp / "r")
    manifest = in_tmp.joinpath("r", *CKPT, MANIFEST)
    manifest.write_text(json.dumps({"format": 1, "files": files}))
    result = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2"])
    assert result.exit_code == 2, result.output
    assert "manifest.json: malformed" in result.output and "internal error" not in result.output


def test_resume_blames_the_flag_that_changes_the_lora_rank(in_tmp, trained):
    _copy(trained, in_tmp / "r")
    result = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2", "--set", "model.lora_rank=4"])
    assert result.exit_code == 2, result.output
    assert "--set model.lora_rank cannot change a resumed run" in result.output and "= 8" in result.output
