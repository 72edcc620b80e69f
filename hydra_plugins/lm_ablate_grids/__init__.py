"""lm-ablate's Hydra plugins (found by Hydra's plugin scan of the ``hydra_plugins`` namespace package)."""
