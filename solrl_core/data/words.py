"""The words a tiny model's text encoder knows, read without torch from its weights folder's
config.json, so `solrl infer` names a prompt's unknown word in a second rather than after the model
loads; and the one check of prompts against a vocabulary (tools/inference.py runs it on a loaded model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from solrl_core.errors import SolrlError

WEIGHTS_FILE, ARCH_FILE = "model.safetensors", "config.json"
MODELS_FOLDER = Path(__file__).resolve().parents[1] / "models"  # the shipped weights (not imported: that loads torch)


def weights_folder(spec: str) -> Path:
    """A weights folder by path, or by name among those shipped in solrl_core/models/."""
    path = Path(spec)
    if path.is_dir():
        return path
    shipped = MODELS_FOLDER / spec
    if shipped.is_dir():
        return shipped
    raise SolrlError(f"tiny model weights '{spec}' not found (neither a folder nor a shipped weights name)",
                     "give a folder holding config.json and model.safetensors in model.weights, or leave it empty")


def known_words(loader: str, weights: str) -> tuple[str, ...]:
    """The vocabulary of a tiny model (model.loader) with a weights folder (model.weights); () where it
    is not known before the model loads (a random init's default, any other model: those take any text
    or are checked once loaded)."""
    if loader not in ("tiny", "tiny_video") or not weights:
        return ()
    try:
        vocab = json.loads((weights_folder(weights) / ARCH_FILE).read_text(encoding="utf-8")).get("vocab", ())
    except (OSError, ValueError, SolrlError):
        return ()  # a broken folder is the model loader's to explain
    return tuple(vocab) if isinstance(vocab, list) else ()


def check_words(vocabulary: tuple[str, ...], prompts: list[str]) -> None:
    """A model with a fixed vocabulary (the tiny ones) would silently drop the words it does not know:
    name them instead, with the words it does know. () = any text."""
    if not vocabulary:
        return
    known = set(vocabulary)
    unknown = list(dict.fromkeys(w for p in prompts for w in re.findall(r"\w+", p.lower()) if w not in known))
    if unknown:
        raise SolrlError(f"the model does not know the word{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(w) for w in unknown)}: its text encoder would drop "
                         f"{'them' if len(unknown) > 1 else 'it'}",
                         f"write prompts from its vocabulary: {' '.join(sorted(known))} (e.g. 'a red circle left of a "
                         f"blue square')")
