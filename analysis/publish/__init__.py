"""W&B outputs: a workspace laid out along the compared axes, and the study's findings as a W&B Report."""
