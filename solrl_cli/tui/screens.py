"""The TUI's dialogs: the stop question of `train --tui`, and the help screen (`?`) listing every key."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from solrl_cli.tui.state import PANELS


class StopScreen(ModalScreen[bool]):
    """q during `train --tui`: stop safely (finish the iteration, save a checkpoint) or cancel."""

    def __init__(self, run_dir: str) -> None:
        super().__init__()
        self.run_dir = run_dir

    DEFAULT_CSS = """
    StopScreen { align: center middle; }
    StopScreen > Static { width: 78; height: auto; border: thick $warning; padding: 1 2; background: $surface; }
    """
    BINDINGS = [Binding("s,enter", "dismiss(True)", "stop safely"), Binding("c,escape", "dismiss(False)", "cancel")]

    def compose(self) -> ComposeResult:
        yield Static("[bold]Stop training?[/]\n\n"
                     "[bold]s[/]  stop safely: finish this iteration, save a checkpoint, then exit\n"
                     f"     (continue later with `solrl train --resume {escape(self.run_dir)}`)\n"
                     "[bold]c[/]  cancel: keep training and watching")


def help_text(training: bool) -> str:
    """Every key of the app, in the order a first-time user needs them."""
    panels = "\n".join(f"  [bold]{i}[/]           {label}" for i, label in enumerate(PANELS.values(), 1))
    quit_text = ("stop: asks whether to stop safely (finish the iteration, save a checkpoint) or cancel" if training
                 else "quit the monitor (the run is not touched)")
    return ("[bold]Keys[/]\n\n"
            f"{panels}\n"
            "  [bold]tab[/]         next panel ([bold]shift+tab[/] previous)\n"
            "  [bold]up/down[/]     scroll the panel ([bold]pgup/pgdn[/] a page, [bold]home/end[/] the ends)\n"
            "  [bold]p[/]           pause the display: new events wait, nothing is lost; p again resumes\n"
            f"  [bold]q[/]           {quit_text}\n"
            "  [bold]?[/]           this help ([bold]escape[/] or [bold]?[/] closes it)\n\n"
            "The header: the run; its progress, latest reward and eta (recent seconds per iteration x iterations "
            "left, evaluations not counted); warnings, the last event, and the training process's CPU use "
            "(100% = one core) and resident memory (RSS), with each GPU's use where there is one.")


class HelpScreen(ModalScreen[None]):
    """`?`: the keys, over the app; escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100%; max-width: 90; height: auto; max-height: 100%; border: thick $accent;
                                  padding: 0 1; background: $surface; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, training: bool) -> None:
        super().__init__()
        self.training = training

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.training))
