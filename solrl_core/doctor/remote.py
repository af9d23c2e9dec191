"""Doctor checks of the rewards behind a URL (remote:URL, vlm:URL): reachable, the expected schema,
what they serve, and how long a round trip takes. These are the only checks that reach the
network: each asks the endpoint the run names, once, with a short time limit."""

from __future__ import annotations

from solrl_core.config.schema import Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check
from solrl_core.errors import SolrlError
from solrl_core.rewards.endpoints import is_endpoint
from solrl_core.rewards.probe import PROBE_TIMEOUT_S, probe_endpoint
from solrl_core.rewards.transport import Unreachable

TIMEOUT_S = PROBE_TIMEOUT_S
SLOW_S = 1.0  # a health round trip slower than this is worth a warning: every batch pays it at least once


def _remote_rewards(cfg: Config) -> list[Check]:
    return [_endpoint(name, cfg.reward.remote, cfg.model.frames > 0) for name in cfg.reward.weights
            if is_endpoint(name)]


def _endpoint(name: str, settings: dict[str, str], video: bool = False) -> Check:
    row = f"reward endpoint {name}"
    try:
        judge = probe_endpoint(name, settings, TIMEOUT_S, video)
    except SolrlError as exc:  # unreachable: no run is under way to resume, whatever the transport's fix says
        return Check(row, FAIL, exc.message, Unreachable.START if isinstance(exc, Unreachable) else exc.fix, True)
    detail = judge.detail
    latency = f"; round trip {judge.latency_s * 1000:.0f} ms"
    if judge.latency_s > SLOW_S:
        return Check(row, WARN, detail + latency, "a slow answer to a health request: check the network or the "
                                                  "server's load", True)
    return Check(row, PASS, detail + latency, "", True)
