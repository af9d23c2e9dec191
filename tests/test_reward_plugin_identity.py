"""A reward server's fingerprint of a plugin covers its code: a plugin file edited to score otherwise
is another reward under the same name, and a run resumed against it (a real `solrl train --resume`
process, against a real server on 127.0.0.1) is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from solrl_core.rewards import RewardSet
from solrl_core.rewards.identity import server_identity
from tests.conftest import FAST
from tests.serving import ROOT, free_port, request, reward_server

SCORE = "images.mean(dim=(1, 2, 3))"
SWAP = "import torch\n\n\ndef score(images, prompts):\n    return {}\n"


class Weighted:
    """A plugin class whose weights live on its instance."""

    def __init__(self) -> None:
        self.net = torch.nn.Linear(3, 1)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self.net(images.mean(dim=(2, 3))).squeeze(1)


def identity_of(name: str) -> dict:
    return server_identity(RewardSet({name: 1.0}).rewards, {name: 1.0}, "1.0")


def test_a_plugins_fingerprint_covers_its_source_and_its_weights(tmp_path):
    same, changed = tmp_path / "same.py", tmp_path / "changed.py"
    same.write_text(SWAP.format(SCORE))
    changed.write_text(SWAP.format(f"1 - {SCORE}"))
    original = identity_of(f"{same}:score")["rewards"][0]["fingerprint"]
    assert identity_of(f"{same}:score")["rewards"][0]["fingerprint"] == original  # the same file: the same reward
    changed.rename(same)  # edited in place
    assert identity_of(f"{same}:score")["rewards"][0]["fingerprint"] != original

    name = f"{__name__}:Weighted"
    torch.manual_seed(0)
    first = identity_of(name)["rewards"][0]["fingerprint"]
    torch.manual_seed(1)
    assert identity_of(name)["rewards"][0]["fingerprint"] != first  # other weights on the plugin's instance


def _solrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SOLRL_DEBUG": ""})


@pytest.mark.slow
def test_a_resume_against_a_plugin_server_whose_file_now_scores_otherwise_is_refused(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    plugin, run_dir, port = tmp_path / "swap.py", tmp_path / "r", free_port()
    plugin.write_text(SWAP.format(SCORE))
    url = f"http://127.0.0.1:{port}"
    sets = [a for s in (*FAST, "run.eval_prompts=", "run.checkpoint_every=1") for a in ("--set", s)]
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    # the first run in process: it is not under test
    with reward_server(tmp_path, "--reward", f"{plugin}:score", port=port):
        first = CliRunner().invoke(app, ["train", *sets, "--reward", f"remote:{url}", "--iterations", "1", "--run-dir",
                                         str(run_dir)])
    assert first.exit_code == 0, first.output

    plugin.write_text(SWAP.format(f"1 - {SCORE}"))  # the same name and weight, the reward inverted
    with reward_server(tmp_path, "--reward", f"{plugin}:score", port=port) as served:
        served_now = request(served.url + "/info")[1]["rewards"]
        refused = _solrl("train", "--resume", str(run_dir), "--iterations", "2", "--trust-run-config")
    assert [(r["name"], r["weight"]) for r in served_now] == [(f"{plugin}:score", 1.0)]
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output
    error = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and error[0].startswith(f"error: the server's reward changed since this run started: "
                                                   f"remote:{url} serves {plugin}:score=1"), output
    assert "the same names with other code or weights" in error[0] and "Traceback" not in output
    assert "a plugin's file as it was" in output and "reward.remote.on_change=warn" in output
    assert not (Path(run_dir) / "checkpoints" / "iter_000002").exists()
