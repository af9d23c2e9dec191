"""Library chatter (optional-backend probes, torch's _pytree deprecations) kept off the user's screen:
the `solrl` command and the Python API (solrl/__init__.py) both call this before the heavy imports."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_third_party() -> None:
    """Library chatter (optional-backend probes, deprecations) is not the user's business; SOLRL_DEBUG=1 keeps it."""
    if os.environ.get("SOLRL_DEBUG", "") in ("", "0"):
        # diffusers and transformers reset their loggers' level on import: their own variables win.
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        for logger in ("torchao", "diffusers", "transformers", "torch.utils._pytree", "peft"):
            logging.getLogger(logger).setLevel(logging.ERROR)
