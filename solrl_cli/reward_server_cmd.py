"""`solrl reward-server`: serve built-in rewards over HTTP for `--reward remote:URL` (rewards/server.py)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import console
from solrl_cli.errors import user_errors

Token = Annotated[Optional[str], typer.Option("--token", envvar="SOLRL_REWARD_TOKEN", show_envvar=True,
                                             help="Every request must send 'Authorization: Bearer TOKEN'. Needed to "
                                                  "bind anywhere but loopback.")]
Paths = Annotated[Optional[list[str]], typer.Option("--path", help="NAME=DIR: a local folder with a model reward's "
                                                                  "weights (as reward.paths.NAME; repeatable).")]


def reward_server(
    reward: Annotated[str, typer.Option("--reward", "-r", help="Reward preset or name, or several with weights: "
                                                                "pickscore=1.0,hpsv2=0.5.")],
    host: Annotated[str, typer.Option("--host", help="Address to bind. Not loopback: needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one, printed).")] = 8000,
    device: opt.Device = None,
    token: Token = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Images per scoring call; queued requests are "
                                                                        "merged up to it.")] = 32,
    max_images: Annotated[int,
            typer.Option("--max-images", min=1, help="Images one request may hold (more: HTTP 413).")] = 512,
    max_side: Annotated[int, typer.Option("--max-side", min=0, help="Pixels per image side (more: HTTP 422). 0: the "
                                                                    "larger of 2048 and 4x the side the rewards resize "
                                                                    "to.")] = 0,
    max_decoded_mb: Annotated[float, typer.Option("--max-decoded-mb", min=0, help="MiB of decoded float32 pixels per "
                                                  "request (more: HTTP 413) and of all requests in flight together "
                                                  "(later ones wait). 0: 128.")] = 0.0,
    max_request_mb: Annotated[float, typer.Option("--max-request-mb", min=0, help="MiB per request body (more: HTTP "
                                                  "413, before it is read). 0: the largest legitimate body (172 MiB by "
                                                  "default).")] = 0.0,
    header_timeout: Annotated[float, typer.Option("--header-timeout", min=0, help="Seconds a request's headers may "
                                                  "take; its body gets as long again plus 1 s per MiB. 0: 10.")] = 0.0,
    max_connections: Annotated[int, typer.Option("--max-connections", min=0, help="Open connections at once. 0: half "
                                                 "the open-file limit, at most 512.")] = 0,
    path: Paths = None,
) -> None:
    """Serve built-in rewards over HTTP (JSON, no pickle) for `solrl train --reward remote:URL`."""
    from solrl_core.config.presets import reward_weights
    from solrl_core.rewards.server import ServerOptions, serve

    with user_errors():
        paths = dict(_path(p) for p in path or ())
        opts = ServerOptions(reward_weights(reward), host=host, port=port, device=device or "auto", token=token or "",
                             batch_size=batch_size, max_images=max_images, max_side=max_side,
                             max_decoded_mb=max_decoded_mb,
                             max_request_mb=max_request_mb, header_timeout_s=header_timeout,
                             max_connections=max_connections,
                             paths=paths)

        def ready(url: str, info: dict) -> None:
            served = ", ".join(f"{r['name']}={r['weight']:g}" for r in info["rewards"])
            console.print(f"solrl reward-server: {served} on {info['device']}, listening on {url}"
                          f"{' (token required)' if info['token_required'] else ''}")
            console.print(f"  train with: solrl train --reward remote:{url}")
        serve(opts, ready)


def _path(text: str) -> tuple[str, str]:
    from solrl_core.errors import SolrlError

    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise SolrlError(f"--path {text} is not NAME=DIR", "for example --path pickscore=/models/PickScore_v1")
    return name, folder
