"""The remote: client against hostile servers, each a real socket server on 127.0.0.1 in a thread:
one that trickles its answer a byte at a time cannot hold a run's start-up past reward.timeout_s (a
real `solrl train` process), one that answers 768 MiB is refused without being read to the end,
and one whose answer nests 100,000 deep is one line, not a RecursionError."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

import pytest

from solrl_core.errors import SolrlError
from solrl_core.rewards.remote import RemoteReward
from solrl_core.rewards.transport import MAX_ANSWER_BYTES
from tests.conftest import FAST
from tests.serving import ROOT
from tests.serving import HEAD, hostile, trickle

HUGE = 768 * 2**20


def test_a_server_trickling_its_answer_cannot_hold_start_up_past_the_reward_timeout(tmp_path):
    sets = [a for s in (*FAST, "run.eval_prompts=", "reward.timeout_s=3") for a in ("--set", s)]
    with hostile(trickle) as url:
        t0 = time.monotonic()
        try:
            run = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--reward", f"remote:{url}", *sets,
                                  "--iterations", "1", "--run-dir", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                                 text=True, timeout=90, env={**os.environ, "PYTHONPATH": str(ROOT), "SOLRL_DEBUG": ""})
        except subprocess.TimeoutExpired:
            pytest.fail("start-up still waited on the trickling server after 90 s, with reward.timeout_s=3")
        seconds = time.monotonic() - t0
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"reward server {url} did not answer within 3 s" in run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert seconds < 60, seconds  # the process's own start-up (imports) plus 3 s; the trickle lasts 120 s


def test_a_huge_answer_is_refused_without_reading_it_to_the_end():
    sent: list[int] = []

    def flood(declared: bool) -> Callable[[socket.socket, threading.Event], None]:
        def answer(conn: socket.socket, stop: threading.Event) -> None:
            conn.sendall(HEAD + (b"Content-Length: %d\r\n" % HUGE if declared else b"Connection: close\r\n") + b"\r\n")
            chunk, count = b'{"pad": "' + b"a" * (2**20 - 9), 0
            try:
                while count < HUGE and not stop.is_set():
                    conn.sendall(chunk)
                    count += len(chunk)
            finally:
                sent.append(count)
        return answer

    for declared in (True, False):
        with hostile(flood(declared)) as url:
            with pytest.raises(SolrlError) as refused:
                RemoteReward(f"remote:{url}", timeout_s=60)
        message = refused.value.message
        assert message == (f"reward server {url} answered with more than {MAX_ANSWER_BYTES} bytes, more than any "
                           "answer of a reward server or VLM API holds"), message
    # what the loopback's buffers took before the client hung up, not 768 MiB
    assert len(sent) == 2 and max(sent) < 4 * MAX_ANSWER_BYTES, sent


def test_an_answer_nested_100k_deep_is_one_line_not_a_recursion_error():
    deep = b"[" * 100_000 + b"]" * 100_000

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(deep) + deep)

    with hostile(answer) as url:
        with pytest.raises(SolrlError) as refused:
            RemoteReward(f"remote:{url}", timeout_s=60)
    assert refused.value.message == (f"reward server {url} answered with a body that is JSON nested deeper than 64 "
                                     "levels, more than any answer of a reward server or VLM API")
    assert "\n" not in refused.value.message + refused.value.fix
