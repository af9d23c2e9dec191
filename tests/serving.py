"""Real servers for the tests: started as subprocesses on free loopback ports, waited for, killed after."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, dict]:
    """(HTTP status, JSON answer) of a GET (body None) or POST of raw `body` bytes."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})},
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class Served:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serve(args: list[str], ready_path: str, tmp_path: Path, headers: dict[str, str] | None = None,
          env: dict[str, str] | None = None, port: int = 0, open_files: int = 0) -> Iterator[Served]:
    """Run `python ARGS --port P` from the repository root until GET ready_path answers; kill it after.
    `port`: that one (0: a free one); `open_files`: the server's descriptor limit (0: as ours)."""
    port = port or free_port()
    log = tmp_path / f"server-{port}.log"

    def limit() -> None:
        if open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args, "--port", str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "SOLRL_DEBUG": "", **(env or {})},
                                preexec_fn=limit)
    served = Served(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode} before answering:\n{served.output()[-3000:]}")
            try:
                if request(served.url + ready_path, headers=headers, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server did not answer {ready_path} within 90 s:\n{served.output()[-3000:]}")
            time.sleep(0.2)
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def reward_server(tmp_path: Path, *args: str, headers: dict[str, str] | None = None, env: dict[str, str] | None = None,
                  port: int = 0, open_files: int = 0) -> contextlib.AbstractContextManager[Served]:
    return serve(["-m", "solrl_cli", "reward-server", *args], "/health", tmp_path, headers=headers, env=env, port=port,
                 open_files=open_files)
