"""Tables that fit the terminal (80 columns when the output is piped, rich's default): a number is
never cut. Text columns fold to fit; when the numbers alone are wider than the screen, they are
split over several tables, each repeating the key columns, rather than ellipsized."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

TEXT_MIN = 14  # a text column is given at least this many characters before the numbers are split


@dataclass(frozen=True)
class Column:
    """`number`: printed whole, right-aligned; `key`: printed whole, repeated in every part of a split
    table; `text`: folded (wrapped, long words broken) to fit, shown in the first part only."""

    name: str
    kind: Literal["number", "key", "text"] = "number"


def fitted_tables(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                  title: str = "") -> list[Table]:
    """The rows as one table, or as several side parts when the numbers need more than the console's width."""
    keys = [i for i, c in enumerate(columns) if c.kind == "key"]
    texts = [i for i, c in enumerate(columns) if c.kind == "text"]
    groups: list[list[int]] = [[]]
    for i in (i for i, c in enumerate(columns) if c.kind == "number"):
        trial = sorted(keys + groups[-1] + [i] + (texts if len(groups) == 1 else []))
        if groups[-1] and _natural_width(console, columns, rows, trial) > console.width:
            groups.append([i])
        else:
            groups[-1].append(i)
    parts = []
    for n, group in enumerate(groups):
        chosen = sorted(keys + group + (texts if n == 0 else []))
        name = title if n == 0 else "(continued)"
        parts.append(_table(columns, rows, chosen, name))
    return parts


def print_fitted(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str = "",
                 caption: str = "") -> None:
    """Print fitted_tables, then the caption across the full width (a caption under a narrow table would wrap to its
    width)."""
    for table in fitted_tables(console, columns, rows, title):
        console.print(table)
    if caption:
        console.print(Text(caption), soft_wrap=False)


def _table(columns: Sequence[Column], rows: Sequence[Sequence[str]], chosen: list[int], title: str,
           widths: dict[int, int] | None = None) -> Table:
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True)
    for i in chosen:
        c = columns[i]
        fixed = c.kind != "text"
        table.add_column(c.name, justify="right" if c.kind == "number" else "left", no_wrap=fixed,
                         overflow="fold", width=(widths or {}).get(i), min_width=(widths or {}).get(i))
    for row in rows:
        table.add_row(*(Text(str(row[i])) for i in chosen))
    return table


def _natural_width(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                   chosen: list[int]) -> int:
    """The width of these columns with every number and key whole and every text column at its minimum."""
    widths = {}
    for i in chosen:
        longest = max([len(columns[i].name)] + [Text(str(r[i])).cell_len for r in rows])
        widths[i] = min(longest, TEXT_MIN) if columns[i].kind == "text" else longest
    unbounded = console.options.update_width(100_000)  # measured as it would be, not clipped to the screen
    return console.measure(_table(columns, rows, chosen, "", widths), options=unbounded).maximum
