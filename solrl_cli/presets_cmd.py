"""`solrl presets` and `solrl config-help`: what can be combined, and every setting."""

from __future__ import annotations

from rich.table import Table

from solrl_cli.common import PRECEDENCE, console
from solrl_cli.errors import user_errors


def presets() -> None:
    """List the built-in model, family and reward presets and prompt sets."""
    from solrl_core.presets import list_presets
    from solrl_core.prompt_sets import cached_path, download_sets
    from solrl_core.prompts import builtin_sets

    with user_errors():
        table = Table(title="solrl presets  (combine as --model M --family F --reward R, or --preset M_F_R)")
        table.add_column("kind")
        table.add_column("name", style="cyan")
        table.add_column("description")
        for p in list_presets():
            table.add_row(p.kind[:-1] if p.kind != "families" else "family", p.name, p.description)
        for name in builtin_sets():
            table.add_row("prompts", name, "built-in prompt set (--prompts NAME)")
        for name, entry in download_sets().items():
            state = f"downloaded: {cached_path(entry)}" if cached_path(entry).is_file() else f"needs a download, done on first use: {entry.origin}"
            table.add_row("prompts", name, f"{entry.description} ({state})")
        console.print(table)
        console.print(f"precedence: {PRECEDENCE}")


def config_help() -> None:
    """Every setting `--set section.key=value` accepts, with its default and meaning."""
    from solrl_core.config_io import help_table

    table = Table(title="settings")
    for col in ("key", "default", "meaning"):
        table.add_column(col)
    for row in help_table():
        table.add_row(*row)
    console.print(table)
