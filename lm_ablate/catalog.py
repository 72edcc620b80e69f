"""Every module that registers options, imported once: after :func:`load_all` every registry is complete
(validation, the walk of each option's keys, tests that list a group's options). A floor above the components,
so that the registries themselves need none of them."""

from __future__ import annotations


def load_all() -> None:
    """Import every module that registers options, so every registry is complete."""
    import lm_ablate.components
    import lm_ablate.data
    import lm_ablate.optim
    import lm_ablate.parametrization
    import lm_ablate.regularization
    import lm_ablate.tracking  # noqa: F401
