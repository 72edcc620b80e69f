"""One registry per configurable axis: the yaml file name = its ``name`` field = the registry key.

Model assembly asks a registry to build a component from its config; it never compares option names.

Each option also says which keys of its config node it reads beyond the ones every option reads
(``register("sgd", reads=("momentum", "nesterov"))``): a key some option of the axis reads and the chosen one
does not is that option's to refuse or to clear (lm_ablate/options.py). The axis names the node and the key
that chooses: ``optim`` chooses by ``optim.name``, a sub-option axis such as ``optim.schedule`` by that key, and
both own keys of the ``optim`` node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from lm_ablate.errors import bad

T = TypeVar("T")
ALL_REGISTRIES: list[Registry] = []  # every registry, in creation order (lm_ablate/options.py walks their keys)


class Registry(Generic[T]):
    def __init__(self, axis: str):
        self.axis = axis
        node, _, key = axis.partition(".")
        self.node = node  # the config node whose keys the options read
        self.selector = axis if key else f"{axis}.name"  # the key whose value chooses the option
        self._builders: dict[str, Callable[..., T]] = {}
        self._reads: dict[str, tuple[str, ...]] = {}
        ALL_REGISTRIES.append(self)

    def register(self, *names: str, reads: Iterable[str] = ()) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register a class or factory under one or more option names, each reading ``reads``
        (keys of the axis's node that not every option of the axis reads)."""
        keys = tuple(reads)

        def deco(builder: Callable[..., T]) -> Callable[..., T]:
            for name in names:
                if name in self._builders:
                    raise KeyError(f"{self.axis}: option {name!r} registered twice")
                self._builders[name] = builder
                self._reads[name] = keys
            return builder

        return deco

    def names(self) -> list[str]:
        return sorted(self._builders)

    def reads(self, name: str) -> tuple[str, ...]:
        """The option-specific keys option ``name`` reads (relative to :attr:`node`)."""
        return self._reads[name]

    def owned(self) -> dict[str, list[str]]:
        """Every option-specific key of this axis -> the options that read it."""
        owners: dict[str, list[str]] = {}
        for name in self.names():
            for key in self._reads[name]:
                owners.setdefault(key, []).append(name)
        return owners

    def check(self, key: str, name: str) -> None:
        if name not in self._builders:
            raise bad(key, name, "allowed: " + ", ".join(self.names()))

    def get(self, name: str) -> Callable[..., T]:
        self.check(self.selector, name)
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
