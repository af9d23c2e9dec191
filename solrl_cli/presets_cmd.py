"""`solrl presets` and `solrl config-help`: what can be combined, and every setting."""

from __future__ import annotations

from solrl_cli.common import PRECEDENCE, console
from solrl_cli.errors import user_errors
from solrl_cli.tables import Column, print_fitted


def presets() -> None:
    """List the built-in model and family presets, the rewards (built-in and installed plugins) and prompt sets."""
    from solrl_core.config.presets import list_presets
    from solrl_core.data.prompt_sets import cached_path, download_sets
    from solrl_core.data.prompts import builtin_sets

    with user_errors():
        rows = [(p.kind[:-1] if p.kind != "families" else "family", p.name, p.description) for p in list_presets()]
        rows += [("prompts", name, "built-in prompt set (--prompts NAME)") for name in builtin_sets()]
        for name, entry in download_sets().items():
            state = f"downloaded: {cached_path(entry)}" if cached_path(entry).is_file() else f"needs a download, done on first use: {entry.origin}"
            rows.append(("prompts", name, f"{entry.description} ({state})"))
        print_fitted(console, [Column("kind", "key"), Column("name", "key"), Column("description", "text")], rows,
                     title="solrl presets  (combine as --model M --family F --reward R, or --preset M_F_R)")
        console.print(f"precedence: {PRECEDENCE}")
        console.print("a reward of your own: --reward mypkg.rewards:fn or path/to/file.py:fn, or an installed package's "
                      "'solrl.rewards' entry point by name (docs/rewards.md)")


def config_help() -> None:
    """Every setting `--set section.key=value` accepts, with its default and meaning."""
    from solrl_core.config.convert import help_table

    print_fitted(console, [Column("key", "key"), Column("default", "text"), Column("meaning", "text")], help_table(), title="settings")
