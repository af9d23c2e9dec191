"""The training loop: the session, one iteration's stages, the update, selection, the loss, evaluations and
calibration."""
