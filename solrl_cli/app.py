"""The `solrl` command: one Typer app over the command modules, each a thin layer over solrl_core."""

from __future__ import annotations

from typing import Annotated

import typer

from solrl_cli.bench_cmd import bench
from solrl_cli.compare_cmd import compare
from solrl_cli.doctor_cmd import doctor
from solrl_cli.eval_cmd import eval_
from solrl_cli.explore_cmd import explore, rank_check
from solrl_cli.infer_cmd import export, infer
from solrl_cli.monitor_cmd import monitor
from solrl_cli.options import Command, Group, plain_labels
from solrl_cli.presets_cmd import config_help, presets
from solrl_core.runtime.quiet import quiet_third_party
from solrl_cli.reward_server_cmd import reward_server
from solrl_cli.train_cmd import train
from solrl_core.runtime.threads import prepare_openmp

app = typer.Typer(name="solrl", cls=Group, no_args_is_help=False, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Sol-RL post-training for text-to-image flow models: FP4 explore, full-precision train.")

for name, command in (("train", train), ("eval", eval_), ("infer", infer), ("export", export), ("explore", explore),
                      ("rank-check", rank_check), ("doctor", doctor), ("monitor", monitor), ("compare", compare),
                      ("presets", presets), ("config-help", config_help), ("reward-server", reward_server),
                      ("bench", bench)):
    app.command(name, cls=Command)(plain_labels(command))


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"solrl {version('solrl')}")
        except PackageNotFoundError:
            typer.echo("solrl (not installed: run pip install -e . in the source folder)")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                                help="Print solrl's version and exit.")] = False) -> None:
    """Sol-RL post-training for text-to-image flow models: FP4 explore, full-precision train."""


def main() -> None:
    prepare_openmp()  # before anything imports torch: libgomp reads its wait policy once, when it loads
    quiet_third_party()
    app()


if __name__ == "__main__":
    main()
