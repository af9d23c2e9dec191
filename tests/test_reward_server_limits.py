"""The reward server under attack, as a real process on 127.0.0.1: a decompression bomb is refused
from its PNG header with the server's memory unchanged, decoded bytes per request and across the
requests in flight are bounded, a JSON body is refused past its values or depth before it is built,
hostile bodies get a 4xx with the reason (never a 500), half-open connections time out without
starving real requests or flooding the log, a huge declared body is refused at once, the token does
not follow a redirect, and a run refuses to resume against a server that now serves another reward."""

import asyncio
import base64
import http.server
import json
import re
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Callable, TypeVar

import pytest
import tomllib
import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.identity import RECORD_FILE, check_servers, server_identity, weights_fingerprint
from solrl_core.rewards.limits import DEFAULT_MAX_SIDE, InFlight, derive
from solrl_core.rewards.remote import RemoteReward
from solrl_core.rewards.tinyworld import TinyWorldReward
from solrl_core.rewards.wire import encode_images
from tests.serving import ROOT, free_port, request, reward_server
from tests.helpers import noisy_world

T = TypeVar("T")
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A server with every limit at its default, on loopback without a token."""
    with reward_server(tmp_path_factory.mktemp("plain"), "--reward", "tinyworld_geneval") as served:
        yield served


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with a token, 128 descriptors (as a small ulimit), a 2 s header timeout and a small decoded limit."""
    with reward_server(tmp_path_factory.mktemp("guarded"), "--reward", "tinyworld_geneval", "--token", TOKEN,
                       "--header-timeout", "2", "--max-decoded-mb", "0.05", headers=AUTH, open_files=128) as served:
        yield served


def chunk(tag: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, tag, body, CRC."""
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def png(side: int, rows: int | None = None) -> bytes:
    """A real RGB PNG of side x side black pixels, compressed as it is written (rows of zeros: ~1000:1).
    `rows`: only that many rows of pixel data, the header still declaring side x side."""
    pack, row = zlib.compressobj(9), b"\0" * (1 + 3 * side)
    data = b"".join(pack.compress(row) for _ in range(side if rows is None else rows)) + pack.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def png_item(raw: bytes) -> dict:
    return {"format": "png", "data": base64.b64encode(raw).decode()}


def post(url: str, body, headers=None, timeout: float = 30):
    return request(url, body if isinstance(body, bytes) else json.dumps(body).encode(), headers, timeout=timeout)


def peak_rss_kib(pid: int) -> int:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1))


def peak_growth_mib(pid: int, action: Callable[[], T]) -> tuple[T, float]:
    """What `action()` returns, and how far the process's peak memory rose above its memory before it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the memory held now
    before = peak_rss_kib(pid)
    result = action()
    return result, (peak_rss_kib(pid) - before) / 1024


def raw_exchange(port: int, data: bytes, timeout: float) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        got, deadline = b"", time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                break
            if not part:
                break
            got += part
        return got


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ---------------------------------------------------------------- images: bombs and decoded bytes


def test_a_png_bomb_is_refused_from_its_header_and_the_server_stays_small(plain):
    import io

    from PIL import Image

    bomb = png(4096)
    assert len(bomb) < 100 * 1024  # tens of KiB on the wire...
    with Image.open(io.BytesIO(bomb)) as img:  # ...a real PNG that decodes to 4096x4096
        img.load()
        assert img.size == (4096, 4096)
    prompts, images = noisy_world(2)
    # warmed up
    assert post(plain.url + "/score", {"prompts": prompts, "images": encode_images(images, "png")})[0] == 200
    before = peak_rss_kib(plain.proc.pid)
    t0 = time.monotonic()
    status, answer = post(plain.url + "/score", {"prompts": ["a red circle"], "images": [png_item(bomb)]})
    seconds = time.monotonic() - t0
    grown_mib = (peak_rss_kib(plain.proc.pid) - before) / 1024
    assert status == 422 and "4096x4096 is larger than the server's" in answer["detail"], answer
    assert seconds < 20, seconds  # 14 ms unloaded; decoding it took 45 s
    # decoded, it is 48 MiB uint8 + 192 MiB float
    assert grown_mib < 16, f"the server's peak memory grew by {grown_mib:.0f} MiB"


def test_decoded_bytes_per_request_are_bounded_and_a_client_splits_its_batch_to_fit(plain, guarded):
    _, info = request(plain.url + "/health")
    side, limit = info["max_side"], info["max_decoded_bytes"]
    # images of the largest side allowed (each passes alone), one more than fit
    count = limit // (side * side * 3 * 4) + 1
    item = png_item(png(side))
    before = peak_rss_kib(plain.proc.pid)
    status, answer = post(plain.url + "/score", {"prompts": ["a red circle"] * count, "images": [item] * count})
    assert status == 413 and f"at most {limit} per request" in answer["detail"], answer
    assert (peak_rss_kib(plain.proc.pid) - before) / 1024 < 16

    prompts, images = noisy_world(24)  # 32x32: the guarded server's 0.05 MiB takes 4 per request
    remote = RemoteReward(f"remote:{guarded.url}", token=TOKEN)
    per_request = remote.images_per_request(images)
    assert 1 < per_request < len(prompts) and per_request * 32 * 32 * 12 <= remote.info["max_decoded_bytes"]
    batches = remote.info["batches_scored"]
    assert torch.equal(remote(images, prompts), TinyWorldReward()(images, prompts))
    _, after = request(guarded.url + "/health", headers=AUTH)
    assert after["batches_scored"] - batches == -(-len(prompts) // per_request)


def test_five_2048_pngs_in_an_80_kb_request_are_refused_before_a_pixel_is_decoded(plain):
    item = png_item(png(2048))
    body = json.dumps({"prompts": ["a red circle"] * 5, "images": [item] * 5}).encode()
    assert len(body) < 100 * 1024  # 240 MiB of float32 pixels once decoded
    (status, answer), grown_mib = peak_growth_mib(plain.proc.pid, lambda: post(plain.url + "/score", body, timeout=120))
    assert status == 422, answer  # tinyworld_geneval declares the largest side it judges: 256 (limits.reward_side)
    assert answer["detail"] == "image 0: 2048x2048 is larger than the server's 256 pixels per side"
    assert grown_mib < 300, f"the server's peak memory grew by {grown_mib:.0f} MiB"  # before: scored, +1.5 GB


def test_the_rewards_own_work_is_bounded_two_2048_pngs_within_the_decode_budget_add_no_gigabyte(plain):
    """Two 2048x2048 PNGs (41 KB on the wire, 96 MiB decoded: within the decode budget) raised a
    tinyworld_geneval server's peak by 0.99 GB as the reward judged every pixel; now the reward's
    declared side refuses them before decoding, and the largest images it takes are scored in a few MiB."""
    two = json.dumps({"prompts": ["a red circle"] * 2, "images": [png_item(png(2048))] * 2}).encode()
    assert len(two) < 64 * 1024
    (status, answer), grown_mib = peak_growth_mib(plain.proc.pid, lambda: post(plain.url + "/score", two, timeout=300))
    assert status == 422 and "2048x2048 is larger than the server's 256 pixels per side" in answer["detail"], answer
    assert grown_mib < 64, f"the server's peak memory grew by {grown_mib:.0f} MiB"
    largest = json.dumps({"prompts": ["a red circle"] * 2, "images": [png_item(png(256))] * 2}).encode()
    (status, answer), grown_mib = peak_growth_mib(plain.proc.pid,
                                                  lambda: post(plain.url + "/score", largest, timeout=300))
    assert status == 200 and len(answer["total"]) == 2, answer
    assert grown_mib < 64, f"scoring two 256x256 images grew the server's peak by {grown_mib:.0f} MiB"


def test_requests_in_flight_share_one_decoded_budget(tmp_path):
    """Four clients at once, each with two 2048x2048 PNGs (96 MiB decoded) under a 100 MiB budget: all
    are scored, one after another, and the server holds about one request's pixels and its reward's
    working copies, not four requests' (1.2 GB before)."""
    body = json.dumps({"prompts": ["a red circle"] * 2, "images": [png_item(png(2048))] * 2}).encode()
    with reward_server(tmp_path, "--reward", "jpeg_compressibility", "--max-decoded-mb", "100") as served:
        answers: list = []

        def four_at_once() -> None:
            threads = [threading.Thread(target=lambda: answers.append(post(served.url + "/score", body, timeout=300)))
                       for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        _, grown_mib = peak_growth_mib(served.proc.pid, four_at_once)
    assert [status for status, _ in answers] == [200] * 4, answers
    assert grown_mib < 4 * 100 * 1.05, f"the server's peak memory grew by {grown_mib:.0f} MiB"


def test_room_in_flight_is_granted_in_turn_and_a_request_that_gives_up_passes_its_turn_on():
    async def main() -> list[str]:
        room, order = InFlight(10), []

        async def request(name: str, size: int, release: asyncio.Event) -> None:
            async with room.hold(size):
                order.append(name)
                await release.wait()

        first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(request("a", 8, first))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(request("b", 8, second)), asyncio.create_task(request("c", 2, third))]
        await asyncio.sleep(0.01)
        assert order == ["a"]  # c would fit beside a, but waits its turn behind b
        tasks[1].cancel()  # b's client gave up: c goes next, beside a
        await asyncio.sleep(0.01)
        assert order == ["a", "c"] and room.held == 10
        first.set()
        third.set()
        await asyncio.gather(tasks[0], tasks[2])
        assert room.held == 0 and not room.waiting
        return order

    assert asyncio.run(main()) == ["a", "c"]


def test_57_mib_of_empty_objects_is_refused_before_it_is_built(plain):
    body = b'{"prompts": [' + b"{}," * (57 * 2**20 // 3) + b"{}]}"
    (status, answer), grown_mib = peak_growth_mib(plain.proc.pid, lambda: post(plain.url + "/check", body, timeout=120))
    assert status == 413 and answer["detail"] == "body holds more than 17408 JSON values", answer
    assert "send at most 512 images per request" in answer["fix"]
    # the body, read; json.loads: +1.5 GB
    assert grown_mib < 300, f"the server's peak memory grew by {grown_mib:.0f} MiB"


def test_a_png_is_read_for_its_pixels_alone_and_an_animated_one_is_refused(plain):
    """PIL inflates every compressed text chunk as it opens a file (up to 64 MiB an image): the server
    hands it the chunks that make the pixels only. An animated PNG's frames past the first would never
    be scored: it is refused, not scored on its first frame."""
    prompts, images = noisy_world(2)
    clean = encode_images(images, "png")
    ihdr_end = 8 + 12 + 13
    # 80 MiB inflated
    texts = b"".join(chunk(b"zTXt", b"note%d\0\0" % i + zlib.compress(b"\0" * 2**21, 9)) for i in range(40))
    raw = [base64.b64decode(item["data"]) for item in clean]
    noted = [png_item(r[:ihdr_end] + texts + r[ihdr_end:]) for r in raw]
    expected = post(plain.url + "/score", {"prompts": prompts, "images": clean})[1]["total"]
    status, answer = post(plain.url + "/score", {"prompts": prompts, "images": noted})
    assert (status, answer.get("total")) == (200, expected), answer  # before: 422, PIL's "Decompressed Data Too Large"
    animated = png_item(raw[0][:ihdr_end] + chunk(b"acTL", struct.pack(">II", 5, 0)) + raw[0][ihdr_end:])
    status, answer = post(plain.url + "/score", {"prompts": prompts[:1], "images": [animated]})
    assert status == 422 and answer["detail"] == ("image 0: an animated PNG (5 frames); send each frame as an image of "
                                                  "its own (a clip's frames as 'videos')"), answer


def test_hostile_bodies_get_a_4xx_with_the_reason_never_a_500(plain):
    one = {"format": "uint8", "shape": [True, True, 3], "data": base64.b64encode(b"\0\0\0").decode()}
    cases = [
        (b'{"prompts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested deeper than 32 levels"),
        ({"prompts": ["a red circle"], "images": [one]}, 422, "'shape' must be [H, W, 3] with positive integers"),
        ({"prompts": ["a red circle"], "images": [dict(one, shape=[1, 1.0, 3])]}, 422, "'shape' must be"),
        ({"prompts": ["a red circle"], "images": [png_item(png(20000, rows=1))]}, 422, "20000x20000 is larger than"),
        ({"prompts": ["a red circle"], "images": [png_item(png(32)[:60])]}, 422, "not a readable PNG"),
        ({"prompts": ["a red circle"], "images": [png_item(b"GIF89a" + png(32)[6:])]}, 422, "not a readable PNG"),
        ({"prompts": ["a red circle"], "images": [png_item(png(32)[:16] + bytes(8) + png(32)[24:])]}, 422, "declares "
                                                                                                           "0x0"),
    ]
    for body, status, reason in cases:
        got, answer = post(plain.url + "/score", body)
        assert (got, reason in answer.get("detail", "")) == (status, True), (reason, got, answer)
    prompts, images = noisy_world(2)
    status, answer = post(plain.url + "/score", {"prompts": prompts, "images": encode_images(images, "uint8")})
    assert status == 200 and answer["total"] == TinyWorldReward()(images, prompts).tolist()


def test_the_default_limits_fit_every_legitimate_request():
    for preset in (ROOT / "presets" / "models").glob("*.toml"):
        resolution = tomllib.loads(preset.read_text()).get("resolution", 0)
        assert 2 * resolution <= DEFAULT_MAX_SIDE, preset.name  # twice the largest image any shipped model makes
    default = derive([TinyWorldReward()], max_images=512)
    assert default.max_request_bytes < 500_000_000  # the declared body the server once waited on is refused at once
    small = derive([TinyWorldReward()], max_images=512, max_decoded_mb=1)
    side = 64
    # float32 on the wire: the widest encoding, at the decoded limit
    count = small.max_decoded_bytes // (side * side * 12)
    images = torch.rand(count, 3, side, side, generator=torch.Generator().manual_seed(0))
    body = json.dumps({"prompts": ["a red circle left of a blue square" * 50] * count,
                       "images": encode_images(images, "float32")})
    assert small.max_decoded_bytes * 4 / 3 < len(body) <= small.max_request_bytes


# ---------------------------------------------------------------- connections, timeouts, the log


def test_half_open_connections_time_out_and_do_not_starve_a_real_request(guarded):
    port = port_of(guarded.url)
    log_before = len(guarded.output())
    socks = []
    for _ in range(200):  # more than the 128 descriptors the server has
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /score HTTP/1.1\r\n")  # a request line, and nothing more
        socks.append(sock)
        time.sleep(0.002)  # not a SYN flood (the kernel's to answer): connections the server has accepted
    opened = time.monotonic()
    try:
        prompts, images = noisy_world(4)
        t0 = time.monotonic()
        scores = RemoteReward(f"remote:{guarded.url}", token=TOKEN)(images, prompts)
        assert time.monotonic() - t0 < 30  # a starved request would wait for the client's 600 s limit
        assert torch.equal(scores, TinyWorldReward()(images, prompts))
        closed = 0
        for sock in socks:  # each is closed by the server within the 2 s header timeout
            sock.settimeout(max(0.01, opened + 2.0 + 30 - time.monotonic()))  # wide: on time, they are closed at 2 s
            try:
                while sock.recv(1024):  # a 503 if it was turned away at once, then the end
                    pass
                closed += 1
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed == len(socks)
    finally:
        for sock in socks:
            sock.close()
    log = guarded.output()[log_before:]
    assert "Too many open files" not in log and len(log) < 2000, log[:2000]


def test_a_huge_declared_body_is_refused_at_once_and_a_stalled_body_is_cut_off(plain, guarded):
    head = (b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n")
    t0 = time.monotonic()
    answer = raw_exchange(port_of(plain.url), head % (500_000_000, b""), timeout=60)
    assert answer.startswith(b"HTTP/1.1 413") and b"500000000 bytes is more than" in answer, answer[:200]
    assert time.monotonic() - t0 < 30  # at once, where waiting for the body would take its deadline, 487 s
    t0 = time.monotonic()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    answer = raw_exchange(port_of(guarded.url), head % (1000, auth) + b'{"prompts": ', timeout=60)
    assert answer == b"" and time.monotonic() - t0 < 45  # closed by the server at the body's deadline (2 s), not held


def test_repeated_log_lines_are_rate_limited(guarded):
    log_before = len(guarded.output())
    for _ in range(100):
        answer = raw_exchange(port_of(guarded.url), b"NOT HTTP AT ALL\r\n\r\n", timeout=5)
        assert answer.startswith(b"HTTP/1.1 400")
    time.sleep(0.5)
    log = guarded.output()[log_before:]
    assert 1 <= log.count("Invalid HTTP request received.") <= 6, log[:3000]
    assert "further copies held back" in log


def test_a_wrong_token_is_refused_before_the_body_and_the_connection_closed(guarded):
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Length: 1180000\r\n\r\n"
    t0 = time.monotonic()
    answer = raw_exchange(port_of(guarded.url), head, timeout=30)
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()
    assert time.monotonic() - t0 < 2 + 1180000 / 2**20  # closed before the body's deadline would have closed it


# ---------------------------------------------------------------- redirects


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []
    location = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append((self.server.server_address[1], self.path, self.headers.get("Authorization")))
        if self.location:
            self.send_response(302)
            self.send_header("Location", self.location)
            self.end_headers()
            return
        body = json.dumps({"schema": 1, "rewards": [{"name": "tinyworld_geneval", "weight": 1.0}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_the_token_is_not_sent_along_a_redirect_to_another_origin():
    other_port = free_port()
    redirecting = type("Redirecting", (_Recorder,), {"location": f"http://localhost:{other_port}/health", "seen": []})
    other = type("Other", (_Recorder,), {"seen": []})
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), redirecting),
               http.server.ThreadingHTTPServer(("127.0.0.1", other_port), other)]
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        url = f"http://127.0.0.1:{servers[0].server_address[1]}"
        with pytest.raises(SolrlError, match=r"answered with a redirect \(HTTP 302\) to http://localhost:\d+/health; "
                                             r"redirects are not followed"):
            RemoteReward(f"remote:{url}", token=TOKEN)
        assert redirecting.seen == [(servers[0].server_address[1], "/health", f"Bearer {TOKEN}")]
        assert other.seen == []  # the other origin saw nothing, and no token
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


# ---------------------------------------------------------------- what the server serves, and resume


class _Weighted:
    def __init__(self, seed: int) -> None:
        self.net = torch.nn.Linear(4, 2)
        with torch.no_grad():
            self.net.weight.copy_(torch.randn(2, 4, generator=torch.Generator().manual_seed(seed)))
            self.net.bias.zero_()


def test_a_fingerprint_follows_every_weight_and_every_reward_served():
    a, b = _Weighted(0), _Weighted(0)
    assert weights_fingerprint(a) == weights_fingerprint(b) != ""
    with torch.no_grad():
        b.net.weight[1, 3] = torch.nextafter(b.net.weight[1, 3], torch.tensor(1.0))  # one ulp of one weight
    assert weights_fingerprint(a) != weights_fingerprint(b)
    assert weights_fingerprint(TinyWorldReward()) == ""  # no weights: its name and version stand for it
    one = server_identity({"tinyworld_geneval": TinyWorldReward()}, {"tinyworld_geneval": 1.0}, "1.0")
    assert one != server_identity({"tinyworld_geneval": TinyWorldReward()}, {"tinyworld_geneval": 0.5}, "1.0")
    assert one["fingerprint"] != server_identity({"tinyworld_geneval": TinyWorldReward()}, {"tinyworld_geneval": 1.0},
                                                 "1.1")["fingerprint"]


def test_the_server_says_what_it_serves(plain):
    status, info = request(plain.url + "/info")
    assert status == 200
    _, health = request(plain.url + "/health")
    expected = server_identity({"tinyworld_geneval": TinyWorldReward()}, {"tinyworld_geneval": 1.0},
                               health["versions"]["solrl"])
    assert info == expected == health["identity"]
    assert info["name"] == "solrl reward-server" and len(info["fingerprint"]) == 64


def test_a_changed_server_warns_instead_when_the_run_allows_it(tmp_path):
    class Stub:
        def __init__(self, name: str) -> None:
            self.identity = server_identity({name: TinyWorldReward()}, {name: 1.0}, "1.0")

    (tmp_path / RECORD_FILE).write_text(json.dumps({"remote:http://h:1": Stub("tinyworld_geneval").identity}))
    assert check_servers(tmp_path, {"remote:http://h:1": Stub("tinyworld_geneval")}) == []
    with pytest.raises(SolrlError, match=r"remote:http://h:1 now serves jpeg_compressibility=1 .* not "
                                         r"tinyworld_geneval=1"):
        check_servers(tmp_path, {"remote:http://h:1": Stub("jpeg_compressibility")})
    notes = check_servers(tmp_path, {"remote:http://h:1": Stub("jpeg_compressibility")}, "warn")
    assert len(notes) == 1 and "going on (reward.remote.on_change=warn)" in notes[0]


@pytest.mark.slow
def test_a_resume_against_a_server_now_serving_another_reward_is_refused(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from tests.conftest import FAST

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    runner, port = CliRunner(), free_port()
    fast = [a for s in (*FAST, "run.eval_prompts=", "run.checkpoint_every=1") for a in ("--set", s)]
    url = f"http://127.0.0.1:{port}"
    with reward_server(tmp_path, "--reward", "tinyworld_geneval", port=port):
        first = runner.invoke(app, ["train", *fast, "--reward", f"remote:{url}", "--iterations", "1", "--run-dir", "r"])
        assert first.exit_code == 0, first.output
    recorded = json.loads((tmp_path / "r" / RECORD_FILE).read_text())[f"remote:{url}"]
    assert [r["name"] for r in recorded["rewards"]] == ["tinyworld_geneval"]
    with reward_server(tmp_path, "--reward", "jpeg_compressibility", port=port):  # another reward, the same URL
        refused = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2", "--trust-run-config"])
    assert refused.exit_code == 2, refused.output
    assert f"error: remote:{url} now serves jpeg_compressibility=1" in refused.output
    assert "not tinyworld_geneval=1" in refused.output and "reward.remote.on_change=warn" in refused.output
    assert not (tmp_path / "r" / "checkpoints" / "iter_000002").exists()
    with reward_server(tmp_path, "--reward", "tinyworld_geneval", port=port):  # the same reward again: it goes on
        resumed = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2", "--trust-run-config"])
    assert resumed.exit_code == 0, resumed.output
    assert (tmp_path / "r" / "checkpoints" / "iter_000002").is_dir()
