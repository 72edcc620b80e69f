"""Sources: where runs come from, each read into one :class:`analysis.sources.load.RunSet` (run directories,
the W&B API, W&B offline files)."""
