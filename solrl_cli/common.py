"""What several commands share: the console and the config's precedence, said alike. How a command
that reads a run folder (eval, infer, export, explore, rank-check) finds its config, checkpoint,
prompts and output folder is the core's: solrl_core/tools/sources.py."""

from __future__ import annotations

from solrl_view.safe_console import SafeConsole as Console

# markup=False: run names, prompts and preset texts hold brackets ("solrl[rewards]", "FLUX.2 [klein]") that
# rich would take for style tags; a styled part is given as Text or style=, never as markup in a string.
console = Console(highlight=False, soft_wrap=True, markup=False)

PRECEDENCE = "defaults < model preset < family preset < reward preset < --config FILE < --set < explicit flags"
