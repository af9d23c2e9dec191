"""`solrl presets` and `solrl config-help`: what can be combined, and every setting."""

from __future__ import annotations

from typing import Annotated

import typer

from solrl_cli import options as opt
from solrl_cli.common import PRECEDENCE, console
from solrl_cli.errors import user_errors
from solrl_cli.tables import Column, print_fitted


def presets() -> None:
    """List the built-in model and family presets, the rewards (built-in and installed plugins) and prompt sets."""
    from solrl_core.config.choices import LOSSES
    from solrl_core.config.presets import list_presets
    from solrl_core.data.prompt_sets import cached_path, download_sets
    from solrl_core.data.prompts import builtin_sets

    with user_errors():
        rows = [(p.kind[:-1] if p.kind != "families" else "family", p.name, p.description) for p in list_presets()]
        rows += [("loss", name, text) for name, text in LOSSES.items()]
        rows += [("prompts", name, "built-in prompt set (--prompts NAME)") for name in builtin_sets()]
        for name, entry in download_sets().items():
            state = (f"downloaded: {cached_path(entry)}" if cached_path(entry).is_file() else f"needs a download, done "
                                                                                              f"on first use: "
                                                                                              f"{entry.origin}")
            rows.append(("prompts", name, f"{entry.description} ({state})"))
        print_fitted(console, [Column("kind", "key"), Column("name", "key"), Column("description", "text")], rows,
                     title="solrl presets  (combine as --model M --family F --reward R [--loss L], or --preset M_F_R)")
        console.print(f"precedence: {PRECEDENCE}")
        console.print("a reward of your own: --reward mypkg.rewards:fn or path/to/file.py:fn, or an installed "
                      "package's 'solrl.rewards' entry point by name (docs/rewards.md)")


def config_help(
    match: Annotated[str, typer.Argument(help="Show only the settings whose key holds this: a section (explore) or a "
                                              "word (lr).")] = "",
    model: opt.Model = None, family: opt.Family = None, reward: opt.Reward = None, preset: opt.Preset = None,
    set_: opt.Sets = None,
    all_: Annotated[bool, typer.Option("--all", help="Every setting with its value and meaning (without MATCH the "
                                                    "default is a summary: each section's keys).")] = False,
) -> None:
    """The settings `--set section.key=value` accepts: each section's keys; with MATCH (or --all) each one's value
    for the chosen presets and its meaning."""
    import textwrap

    from rich.text import Text

    from solrl_core.config.convert import help_table
    from solrl_core.config.presets import resolve_config

    with user_errors():
        cfg = resolve_config(model, family, reward, preset=preset, sets=set_ or ())
        rows = help_table(cfg, match)
    width = max(40, console.width)

    # wrapped between words, never inside one: no value cut
    def para(text: str, first: str = "", rest: str = "    ") -> None:
        console.print(Text(textwrap.fill(text, width, initial_indent=first, subsequent_indent=rest,
                                         break_long_words=False,
                                         break_on_hyphens=False)), soft_wrap=True)

    if not match and not all_:  # a summary: the keys by section, and how to see a section whole
        para(f"settings of {cfg.preset}, by section (`--set section.key=value` sets one):", rest="")
        sections: dict[str, list[str]] = {}
        for key, _, _ in rows:
            sections.setdefault(key.partition(".")[0], []).append(key.partition(".")[2])
        for section, keys in sections.items():
            para(f"{section}: {', '.join(keys)}", "  ", "      ")
        para("values and meanings: solrl config-help SECTION_OR_WORD (e.g. solrl config-help explore); every setting: "
             "solrl config-help --all", rest="    ")
        return
    para(f"settings of {cfg.preset}, as `solrl train` with these options runs ({PRECEDENCE})", rest="")
    for key, value, meaning in rows:
        console.print()
        para(f"{key} = {value}")
        para(meaning, "    ")
