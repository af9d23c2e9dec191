"""One health request to a reward behind a URL (remote:URL, vlm:URL): reachable, the expected schema,
what it serves, and how long a round trip takes. The doctor shows it as a check; a run makes the same
request before anything loads (run_inputs.py), and stops on a failure."""

from __future__ import annotations

from dataclasses import dataclass

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Probe:
    detail: str  # what answered, e.g. the server's schema and what it serves
    latency_s: float  # the health request's round trip, measured


def probe_endpoint(name: str, settings: dict[str, str], timeout_s: float = PROBE_TIMEOUT_S,
                   video: bool | None = None) -> Probe:
    """Ask the endpoint `name` once; a SolrlError (saying what is wrong and the fix) if it cannot serve,
    or (`video` given: whether the model makes clips) cannot judge what the model makes."""
    from solrl_core.rewards.endpoints import check_media

    if name.startswith("vlm:"):
        from solrl_core.rewards.vlm import VlmJudge

        judge = VlmJudge(name, settings, timeout_s)
        return Probe(f"OpenAI-compatible, model {judge.model}, judge scoring {judge.judge.scoring}", judge.latency_s)
    from solrl_core.rewards.remote import RemoteReward

    remote = RemoteReward(name, timeout_s, encoding=settings.get("encoding", "uint8"))
    if video is not None:
        check_media(name, remote.media, video)
    info = remote.info
    return Probe(f"solrl reward-server schema {info['schema']} (solrl {info.get('versions', {}).get('solrl', '?')}) "
                 f"serving {', '.join(remote.served)} on {info.get('device', '?')}", remote.latency_s)
