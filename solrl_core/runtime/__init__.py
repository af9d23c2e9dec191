"""The process a run lives in: its device, CPU threads, TF32, torch.distributed and stop requests."""
