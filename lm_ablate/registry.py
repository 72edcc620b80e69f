"""One registry per configurable axis: the yaml file name = its ``name`` field = the registry key.

Model assembly asks a registry to build a component from its config; it never compares option names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from lm_ablate.config import bad

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, axis: str):
        self.axis = axis
        self._builders: dict[str, Callable[..., T]] = {}

    def register(self, *names: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register a class or factory under one or more option names."""

        def deco(builder: Callable[..., T]) -> Callable[..., T]:
            for name in names:
                if name in self._builders:
                    raise KeyError(f"{self.axis}: option {name!r} registered twice")
                self._builders[name] = builder
            return builder

        return deco

    def names(self) -> list[str]:
        return sorted(self._builders)

    def check(self, key: str, name: str) -> None:
        if name not in self._builders:
            raise bad(key, name, "allowed: " + ", ".join(self.names()))

    def get(self, name: str) -> Callable[..., T]:
        self.check(f"{self.axis}.name", name)
        return self._builders[name]

    def build(self, cfg: Any, *args: Any, **runtime: Any) -> T:
        """Build the option ``cfg.name`` with its config and the runtime arguments (sizes, devices...)."""
        return self.get(cfg.name)(cfg, *args, **runtime)


NORMS: Registry = Registry("norm")
PLACEMENTS: Registry = Registry("norm.placement")
POSITIONS: Registry = Registry("position")
ACTIVATIONS: Registry = Registry("activation")
ATTENTIONS: Registry = Registry("attention")
REGULARIZERS: Registry = Registry("regularization")
DATASETS: Registry = Registry("data")
TOKENIZERS: Registry = Registry("data.tokenizer")
OPTIMIZERS: Registry = Registry("optim")
SCHEDULES: Registry = Registry("optim.schedule")
TRACKERS: Registry = Registry("tracking")

# group name -> registry whose keys are that group's yaml files (checked by tests/test_config.py)
REGISTRIES: dict[str, Registry] = {
    "norm": NORMS,
    "position": POSITIONS,
    "activation": ACTIVATIONS,
    "attention": ATTENTIONS,
    "regularization": REGULARIZERS,
    "data": DATASETS,
    "optim": OPTIMIZERS,
    "tracking": TRACKERS,
}


def load_all() -> None:
    """Import every module that registers options, so every registry is complete."""
    import lm_ablate.components
    import lm_ablate.data
    import lm_ablate.optim
    import lm_ablate.regularization
    import lm_ablate.tracking  # noqa: F401
