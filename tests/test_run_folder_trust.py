"""A run folder is data: a reward plugin or a URL reward that someone else's config.toml names is not
imported, nor contacted with the user's token, by any command that opens the folder until the user
accepts it (--trust-run-config, or the same --reward given again); docs/reliability.md, "Threats"."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.errors import SolrlError
from tests.helpers import train_cli

runner = CliRunner()
TOKEN = "token-of-the-user-0123456789"
# The plugin someone planted: importing it leaves a marker (its pid), so a test sees whether it ran.
EVIL = '''
import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"]).write_text(str(os.getpid()))

def score(images, prompts):
    return images.float().mean(dim=(1, 2, 3))
'''
CHEAP_EVAL = ("--prompts", "p.txt", "--seeds", "1", "--steps", "2", "--rewards", "")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    monkeypatch.setenv("EVIL_MARKER", str(tmp_path / "evil-ran"))
    Path("p.txt").write_text("a red circle\n")
    return tmp_path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One finished tiny run (one iteration, no evaluation) that each test copies."""
    home = tmp_path_factory.mktemp("finished")
    cwd = os.getcwd()
    os.chdir(home)
    try:
        train_cli("--iterations", "1", "--run-dir", "r", "--set", "model.lora_rank=8")
    finally:
        os.chdir(cwd)
    return home / "r"


def _planted(finished: Path, here: Path, weights: dict[str, float], eval_rewards: list[str] | None = None) -> Path:
    """A copy of the finished run whose config.toml someone rewrote to name `weights` (and eval rewards),
    with evil.py beside it."""
    import tomli_w
    import tomllib

    run = Path(shutil.copytree(finished, here / "r"))
    (run / "evil.py").write_text(EVIL)
    cfg = tomllib.loads((run / "config.toml").read_text())
    cfg["reward"]["weights"] = weights
    if eval_rewards is not None:
        cfg["run"]["eval_rewards"] = eval_rewards
    (run / "config.toml").write_text(tomli_w.dumps(cfg))
    return run


def _solrl(*args: str, token: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SOLRL_DEBUG", "SOLRL_REWARD_TOKEN")}
    if token:
        env["SOLRL_REWARD_TOKEN"] = TOKEN
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _refused(done: subprocess.CompletedProcess, name: str) -> None:
    """Exit 2 with one error line naming `name` and the flag, and its fix; no traceback."""
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and name in errors[0] and "config.toml" in errors[0], out
    assert "--trust-run-config" in out and "--reward" in out and "Traceback" not in out, out


def test_a_plugin_a_run_folder_names_is_never_imported_until_the_user_accepts_it(in_tmp, finished):
    _planted(finished, in_tmp, {"r/evil.py:score": 1.0})
    marker = in_tmp / "evil-ran"
    for command in (["train", "--resume", "r", "--iterations", "2"], ["eval", "r", *CHEAP_EVAL]):
        _refused(_solrl(*command), "r/evil.py:score")
        assert not marker.exists(), f"{command[0]} imported the plugin the run folder names"

    # accepted: trained in this process (a second subprocess importing torch would add time, not evidence)
    accepted = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2", "--trust-run-config"])
    assert accepted.exit_code == 0 and marker.exists(), accepted.output
    first = accepted.output.splitlines()[0]  # the start-up line names the code scored, not the preset's reward
    assert f"reward {in_tmp / 'r' / 'evil.py'}:score (weight 1)" in first, first
    events = [json.loads(line) for line in (in_tmp / "r" / "events.jsonl").read_text().splitlines()]
    started = [e for e in events if e["event"] == "run_started"][-1]
    assert started["rewards"] == [f"{in_tmp / 'r' / 'evil.py'}:score (weight 1)"]
    assert [e["final"]["components"].keys() for e in events if e["event"] == "iteration"][-1] == {"r/evil.py:score"}

    marker.unlink()
    # the same --reward given again accepts it
    again = _solrl("eval", "r", *CHEAP_EVAL, "--reward", "r/evil.py:score=1")
    assert again.returncode == 0 and marker.exists(), again.stdout + again.stderr


class _Listener:
    """A real socket on 127.0.0.1 that records every request that reaches it and answers 503."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(10)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                finally:
                    self.received.append(head)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():  # type: ignore[no-untyped-def]
    served = _Listener()
    yield served
    served.close()


def test_a_url_a_run_folder_names_gets_no_request_nor_token_until_the_user_accepts_it(in_tmp, finished, listener,
                                                                                      monkeypatch):
    name = f"remote:{listener.url}"
    _planted(finished, in_tmp, {name: 1.0})
    for command in (["train", "--resume", "r", "--iterations", "2"], ["eval", "r", *CHEAP_EVAL]):
        _refused(_solrl(*command, token=True), name)
        assert listener.received == [], f"{command[0]} sent a request to the URL the run folder names"

    # the listener's 503 ends it
    _solrl("train", "--resume", "r", "--iterations", "2", "--trust-run-config", token=True)
    assert len(listener.received) == 1 and f"Authorization: Bearer {TOKEN}".encode() in listener.received[0]
    monkeypatch.setenv("SOLRL_REWARD_TOKEN", TOKEN)  # the same --reward again, in this process (torch is loaded here)
    runner.invoke(app, ["train", "--resume", "r", "--iterations", "2", "--reward", f"{name}=1"])
    assert len(listener.received) == 2 and f"Authorization: Bearer {TOKEN}".encode() in listener.received[1]


def test_an_eval_reward_the_folder_names_is_refused_and_the_python_api_says_how_to_accept(in_tmp, finished):
    import solrl

    _planted(finished, in_tmp, {"tinyworld_geneval": 1.0}, eval_rewards=["r/evil.py:score"])
    refused = runner.invoke(app, ["eval", "r", *CHEAP_EVAL[:-2]])
    assert refused.exit_code == 2 and "(run.eval_rewards) names" in refused.output, refused.output
    assert "--set run.eval_rewards=r/evil.py:score" in refused.output
    with pytest.raises(SolrlError) as raised:
        solrl.train(resume="r", iterations=2)
    assert "r/evil.py:score" in raised.value.message and "trust_run_config=True" in raised.value.fix
    assert not (in_tmp / "evil-ran").exists()


def test_infer_and_export_never_build_the_rewards_a_folder_names(in_tmp, finished):
    _planted(finished, in_tmp, {"r/evil.py:score": 1.0}, eval_rewards=["r/evil.py:score"])
    for command in (["infer", "r", "--prompt", "a red circle", "--seeds", "1", "--steps", "2", "--no-grid"],
                    ["export", "r", "--out", "exported"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
    assert not (in_tmp / "evil-ran").exists()
