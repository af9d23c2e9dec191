"""The one-shot commands' work on a run: explore, infer, export and its model card, and the start of a training run."""
