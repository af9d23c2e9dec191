"""Real servers for the tests: started as subprocesses on free loopback ports, waited for, killed after;
and hostile ones in a thread, that answer as no honest server would."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 30) -> tuple[int, dict]:
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
        proc = subprocess.Popen([sys.executable, *args, "--port", str(port)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT,
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


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@contextlib.contextmanager
def hostile(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A server on 127.0.0.1 that reads each request's first bytes, then answers with `answer(conn, stop)`."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                answer(conn, stop)
            except OSError:  # the client hung up: what these servers are there to see
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """Headers that never end, one byte every 0.5 s (for at most 120 s): each read waits far less than
    any socket timeout."""
    for byte in HEAD + b"X-Pad: " + b"a" * 240:
        if stop.is_set():
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.5)
