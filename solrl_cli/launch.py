"""`solrl train --nproc-per-node N` on one node, or with --nnodes/--node-rank/--rdzv-endpoint on
several: the same train command again, one process per GPU, under torch.distributed's own launcher.

It is exactly `torchrun --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]
-m solrl_cli train ...` (that command typed by hand works the same): one node uses torchrun's
standalone rendezvous on a free local port; several nodes use its static rendezvous, where node 0
listens at HOST:PORT and every node is started with its own --node-rank.

Ctrl-C reaches the launcher, which passes the signal on to every process: they finish the
iteration, save a checkpoint and stop together. torchrun kills them 30 s later whatever they are
doing; a checkpoint is then either complete or absent, and `--resume` goes on from the newest one.
"""

from __future__ import annotations

import os
from typing import Sequence

from solrl_core.errors import SolrlError

LAUNCH_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")


def strip_launcher_flags(argv: Sequence[str]) -> list[str]:
    """`argv` without the launcher's own flags (`--flag VALUE` or `--flag=VALUE`) and a leading `train`."""
    out: list[str] = []
    args = list(argv)
    if args and args[0] == "train":
        args = args[1:]
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in LAUNCH_FLAGS)):
            out.append(arg)
    return out


def torchrun_args(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
                  argv: Sequence[str] = ()) -> list[str]:
    """torchrun's command line for `solrl train argv` on nproc_per_node processes per node."""
    if nproc_per_node < 1 or nnodes < 1:
        raise SolrlError(f"--nproc-per-node {nproc_per_node} --nnodes {nnodes}: both must be at least 1",
                         "--nproc-per-node is the number of GPUs to use on this node")
    if not 0 <= node_rank < nnodes:
        raise SolrlError(f"--node-rank {node_rank} with --nnodes {nnodes}",
                         f"number the nodes 0 to {nnodes - 1}, node 0 at --rdzv-endpoint")
    head = ["--nproc-per-node", str(nproc_per_node), "--nnodes", str(nnodes)]
    if nnodes == 1 and not rdzv_endpoint:
        head.append("--standalone")
    elif not rdzv_endpoint or ":" not in rdzv_endpoint:
        raise SolrlError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (got {rdzv_endpoint or 'none'})",
                         "give every node the address of node 0 and a free port on it, e.g. --rdzv-endpoint node0:29500")
    else:
        head += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv_endpoint]
    return [*head, "-m", "solrl_cli", "train", *strip_launcher_flags(argv)]


def launch(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
           argv: Sequence[str] = (), *, prompts_per_iteration: int | None = None) -> int:
    """Run `solrl train argv` (launcher flags dropped) on every process; returns the exit code:
    0, the first failed worker's code, or 130 when stopped by a signal. Given the resolved
    run.prompts_per_iteration, an uneven split is one error here instead of one per process."""
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
        raise SolrlError("--nproc-per-node was given to a process torchrun already started",
                         "use either torchrun or --nproc-per-node, not both")
    if prompts_per_iteration is not None:
        from solrl_core.prompts import check_split

        check_split(prompts_per_iteration, nproc_per_node * nnodes)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(torchrun_args(nproc_per_node, nnodes, node_rank, rdzv_endpoint, argv))
    if nproc_per_node > 1:  # what torchrun sets anyway, without its banner; run.threads overrides it per process
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run(args)
    except ChildFailedError as exc:
        codes = [f.exitcode for _, f in sorted(exc.failures.items())]
        return next((c for c in codes if c > 0), 1)  # negative: killed by a signal, after another failed
    except SignalException:
        return 130
    return 0
