"""The typed, frozen config, its presets, its files, and the checks of a run's inputs before anything loads."""
