"""Aggregate lm-ablate runs into comparison tables, figures and reports."""
