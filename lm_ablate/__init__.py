"""lm-ablate: ablation harness for transformer language models."""
