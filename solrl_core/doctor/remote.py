"""Doctor checks of the rewards behind a URL (remote:URL, vlm:URL): reachable, the expected schema,
what they serve, and how long a round trip takes. These are the only checks that reach the
network: each asks the endpoint the run names, once, with a short time limit."""

from __future__ import annotations

from solrl_core.config import Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check
from solrl_core.errors import SolrlError
from solrl_core.reward_endpoints import is_endpoint

TIMEOUT_S = 10.0
SLOW_S = 1.0  # a health round trip slower than this is worth a warning: every batch pays it at least once


def _remote_rewards(cfg: Config) -> list[Check]:
    return [_endpoint(name, cfg.reward.remote) for name in cfg.reward.weights if is_endpoint(name)]


def _endpoint(name: str, settings: dict[str, str]) -> Check:
    row = f"reward endpoint {name}"
    try:
        if name.startswith("vlm:"):
            from solrl_core.rewards.vlm import VlmJudge

            judge = VlmJudge(name, settings, TIMEOUT_S)
            detail = f"OpenAI-compatible, model {judge.model}, judge scoring {judge.judge.scoring}"
        else:
            from solrl_core.rewards.remote import RemoteReward

            remote = RemoteReward(name, TIMEOUT_S, encoding=settings.get("encoding", "uint8"))
            info = remote.info
            detail = (f"solrl reward-server schema {info['schema']} (solrl {info.get('versions', {}).get('solrl', '?')}) "
                      f"serving {', '.join(remote.served)} on {info.get('device', '?')}")
            judge = remote
    except SolrlError as exc:
        return Check(row, FAIL, exc.message, exc.fix, True)
    latency = f"; round trip {judge.latency_s * 1000:.0f} ms"
    if judge.latency_s > SLOW_S:
        return Check(row, WARN, detail + latency, "a slow answer to a health request: check the network or the server's load", True)
    return Check(row, PASS, detail + latency, "", True)
