"""`solrl train --nproc-per-node N` on one node, or with --nnodes/--node-rank/--rdzv-endpoint on
several: the same train command again, one process per GPU, under torch.distributed's own launcher.

It is exactly `torchrun --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]
-m solrl_cli train ...` (that command typed by hand works the same): one node uses torchrun's
standalone rendezvous on a free local port; several nodes use its static rendezvous, where node 0
listens at HOST:PORT and every node is started with its own --node-rank.

If the launcher is killed (kill -9), each process notices (its parent-death signal) and stops as
a SIGTERM stops it: it saves the last finished iteration and releases the run lock.

Ctrl-C reaches the launcher, which passes the signal on to every process: they finish the
iteration, save a checkpoint and stop together. torchrun kills them 30 s later whatever they are
doing; a checkpoint is then either complete or absent, and `--resume` goes on from the newest one.
"""

from __future__ import annotations

import os
import signal
from typing import Sequence

from solrl_core.errors import SolrlError

LAUNCH_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint", "--master-addr", "--master-port")


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
                         "give every node the address of node 0 and a free port on it, e.g. --rdzv-endpoint "
                         "node0:29500")
    else:
        head += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv_endpoint]
    return [*head, "-m", "solrl_cli", "train", *strip_launcher_flags(argv)]


def endpoint(rdzv_endpoint: str | None, master_addr: str | None, master_port: int | None) -> str | None:
    """HOST:PORT of node 0, from --rdzv-endpoint or torchrun's --master-addr / --master-port (default
    port 29500, torchrun's), not both."""
    if master_addr is None and master_port is None:
        return rdzv_endpoint
    if rdzv_endpoint:
        raise SolrlError("--rdzv-endpoint and --master-addr/--master-port name node 0 twice", "give one of them")
    return f"{master_addr or '127.0.0.1'}:{master_port or 29500}"


def check_port_free(port: int) -> None:
    """The rendezvous port is free on node 0: in use, torchrun would fail with a store error."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            raise SolrlError(f"port {port} on this node (node 0, which hosts the rendezvous) is in use: {exc.strerror}",
                             "pick a free port for --rdzv-endpoint / --master-port on every node") from exc


def launch(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
           argv: Sequence[str] = (), *, prompts_per_iteration: int | None = None, run_dir: str = "") -> int:
    """Run `solrl train argv` (launcher flags dropped) on every process; returns the exit code:
    0, the first failed worker's code, or 130 when stopped by a signal. Given the resolved
    run.prompts_per_iteration, an uneven split is one error here instead of one per process.

    A worker that dies (killed, out of host memory) or fails makes torchrun stop the others at once
    (SIGTERM, SIGKILL 30 s later), so the run ends instead of waiting in a collective; one line
    says which rank ended it and how. Checkpoints are written atomically, so the newest is intact."""
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
        raise SolrlError("--nproc-per-node was given to a process torchrun already started",
                         "use either torchrun or --nproc-per-node, not both")
    if prompts_per_iteration is not None:
        from solrl_core.data.prompts import check_split

        check_split(prompts_per_iteration, nproc_per_node * nnodes)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(torchrun_args(nproc_per_node, nnodes, node_rank, rdzv_endpoint, argv))
    if nnodes > 1 and node_rank == 0:  # node 0 hosts the rendezvous store on that port
        check_port_free(int(str(rdzv_endpoint).rpartition(":")[2]))
    from solrl_core.runtime.distributed import LAUNCHER_ENV

    os.environ[LAUNCHER_ENV] = str(os.getpid())  # each process stops when this one dies (distributed.watch_launcher)
    if nproc_per_node > 1:  # what torchrun sets anyway, without its banner; run.threads overrides it per process
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run(args)
    except ChildFailedError as exc:
        _say_who_failed(exc, nnodes, run_dir)
        codes = [f.exitcode for _, f in sorted(exc.failures.items())]
        return next((c for c in codes if c > 0), 1)  # negative: killed by a signal, after another failed
    except SignalException:
        return 130
    return 0


def _blame(exitcode: int) -> int:
    """0: killed by a signal of its own (SIGKILL, SIGSEGV, ...); 1: exited with an error; 2: stopped."""
    if exitcode >= 0:
        return 1
    return 2 if -exitcode in (signal.SIGTERM, signal.SIGINT) else 0


def _say_who_failed(exc, nnodes: int, run_dir: str) -> None:  # type: ignore[no-untyped-def]
    """One line on the worker that ended the run (its own error, if it raised one, is printed above).
    torchrun may record the others in the same second as the first (their collectives fail the moment
    it dies, and it stops them with SIGTERM), so a worker killed by another signal is named first,
    then one that exited with an error, then one stopped by SIGTERM or SIGINT."""
    from solrl_cli.errors import err_console

    rank, failure = min(exc.failures.items(), key=lambda kv: (_blame(kv[1].exitcode), kv[1].timestamp, kv[0]))
    how = (f"was killed by signal {failure.signal_name()}" if failure.exitcode < 0
           else f"failed with exit code {failure.exitcode} (its error is above)")
    where = f"; the run directory is {run_dir}" if run_dir else ""
    err_console.print(f"error: rank {rank} (pid {failure.pid}) {how}; torchrun stopped the other processes"
                      f"{' on this node' if nnodes > 1 else ''}{where}", soft_wrap=True)
    err_console.print("  fix: the newest checkpoint is intact (written atomically): continue with "
                      f"`solrl train --resume {run_dir or 'RUN_DIR'}` and the same launcher flags", soft_wrap=True)
