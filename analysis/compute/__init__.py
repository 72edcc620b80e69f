"""Compute: numbers and verdicts from a RunSet (comparisons, statistics, best LR, claims, scaling fits), with
codes where a result needs explaining; no sentences for people and no drawing (present/ does both)."""
