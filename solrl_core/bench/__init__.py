"""`solrl bench`: how fast Sol-RL runs on this machine, before any download.

    encoders.py  offline tokenizers and small text encoders / VAEs of the real widths
    build.py     the model presets' transformers at their published sizes (or tiny ones), random weights,
                 saved as hub-layout pipelines that `solrl train` loads
    flops.py     model FLOPs of one transformer forward (FlopCounterMode on the meta device)
    run.py       the families through `solrl train`'s own code, warm-up dropped: seconds, memory, MFU, ratios
    fits.py      before building at real size: each family against the GPU's memory, by the doctor's estimate
    explore.py   `--explore`: one denoising step per explore backend, its error against bf16, the refresh
    video.py     the Wan video presets: published configs, their bench pipelines, FLOPs derived per step

The per-phase FLOPs, the device's peaks and the MFU are telemetry/'s, shared with a training run's live MFU.

Random weights: speed and memory only, nothing here is a quality figure.
"""
