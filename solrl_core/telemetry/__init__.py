"""A run's live model FLOPs utilisation, counted below the loop so the trainer, `solrl bench`, the
terminal, the TUI and `solrl monitor` all read the same figures.

    model_flops.py  a training run's model FLOPs (FlopCounterMode on a meta copy) per sample and per
                    phase, and the device's peaks, counted once as it starts (the ModelFlops event)
    peaks.py        the device's dense peak FLOP/s by precision: a datasheet table, else a measured GEMM rate
    mfu.py          each iteration's MFU from those and its phase seconds (torch-free: the monitor uses it)

Nothing here imports the session, the loop or a side tool: the trainer and bench/ both import it.
"""
