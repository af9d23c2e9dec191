"""Where a reward model's weights come from: a local path from `reward.paths`, else the hub (or the
Hugging Face cache when offline). Every failure names the hub id, the files expected, and the local
alternative, in one line."""

from __future__ import annotations

from pathlib import Path

from solrl_core.errors import SolrlError


def local_fix(reward: str, files: list[str]) -> str:
    return (f"download them once where there is network, or pass a local folder holding {', '.join(files)} "
            f"with --set reward.paths.{reward}=DIR")


def local_folder(reward: str, path: str, files: list[str]) -> Path:
    """`path` as a folder that must hold every name in `files` (files or subfolders)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise SolrlError(f"reward.paths.{reward} = {path} is not a folder", f"point it at a folder holding "
                                                                            f"{', '.join(files)}")
    missing = [f for f in files if not (folder / f).exists()]
    if missing:
        raise SolrlError(f"{folder} (reward.paths.{reward}) lacks {', '.join(missing)}",
                         f"put {', '.join(files)} there (the layout of the hub repository)")
    return folder


def hub_file(reward: str, repo_id: str, filename: str) -> Path:
    """One file of a hub repository through huggingface_hub (its cache, HF_HUB_OFFLINE, HF_TOKEN)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes the same actionable error
        raise SolrlError(f"reward '{reward}' needs {filename} from hub {repo_id}, which is neither in the Hugging Face "
                         f"cache nor reachable ({type(exc).__name__})", local_fix(reward, [filename])) from exc

