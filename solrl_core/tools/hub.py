"""`solrl export --push-to-hub REPO`: an export folder uploaded to a Hugging Face Hub model repo.

Through huggingface_hub's `HfApi.create_repo` (exist_ok) and `upload_folder`, at `HF_ENDPOINT` as set
when the push runs (default https://huggingface.co), with the token huggingface_hub finds (`HF_TOKEN`,
else `hf auth login`'s). What can go wrong is said in one line: no token, a token the hub refuses, no
write access, an endpoint that does not answer, huggingface_hub missing. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from solrl_core.errors import SolrlError

LOGIN_HINT = "set HF_TOKEN=hf_... (a write token from https://huggingface.co/settings/tokens) or run `hf auth login`"
# Transport failures of the HTTP clients huggingface_hub has used (httpx2, httpx, requests), by class name.
_NETWORK = {"TransportError", "TimeoutException", "RequestException", "ConnectionError", "OfflineModeIsEnabled"}


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as exc:
        raise SolrlError("--push-to-hub needs huggingface_hub, which is not installed",
                         "pip install huggingface_hub") from exc
    return huggingface_hub


def endpoint() -> str:
    """The hub's address, read when called (huggingface_hub reads HF_ENDPOINT once, at import)."""
    _hub()
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def check_push(repo_id: str) -> str:
    """Before anything is exported: the repo id is valid and a token is there. Returns the token."""
    hub = _hub()
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as exc:
        raise SolrlError(f"--push-to-hub {repo_id!r} is not a hub repo id: {exc}", "give OWNER/NAME, e.g. "
                                                                                   "me/sana-pickscore-lora") from exc
    token = hub.get_token()
    if not token:
        raise SolrlError("--push-to-hub found no Hugging Face token", LOGIN_HINT)
    return token


def _network(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or any(c.__name__ in _NETWORK for c in type(exc).__mro__)


def push_folder(folder: Path, repo_id: str, private: bool, message: str) -> str:
    """Create the model repo `repo_id` if missing (private when asked) and upload `folder` to it as
    one commit; returns the repo's URL."""
    token = check_push(repo_id)
    hub = _hub()
    from huggingface_hub.errors import HfHubHTTPError

    url = endpoint()
    api = hub.HfApi(endpoint=url, token=token)
    kept = f"the export is kept in {folder}; push it later with `hf upload {repo_id} {folder}`"
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=message)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise SolrlError(f"the hub at {url} refused the token (401 Unauthorized); {kept}", LOGIN_HINT) from exc
        if status == 403:
            raise SolrlError(f"the token may not write to {repo_id} at {url} (403 Forbidden); {kept}",
                             "use a token with write access to that namespace, or push to your own (YOU/NAME)") from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SolrlError(f"the hub at {url} answered {status}: {first}; {kept}",
                         "check the repo id and try again") from exc
    except Exception as exc:
        if not _network(exc):
            raise
        raise SolrlError(f"cannot reach the hub at {url} ({type(exc).__name__}: {exc}); {kept}",
                         "check the network, or set HF_ENDPOINT to a hub mirror you can reach") from exc
    return str(repo)
