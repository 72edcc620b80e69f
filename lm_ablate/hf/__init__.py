"""Import a Hugging Face transformers causal LM as the equivalent lm-ablate model (config translated, weights
copied), so a real architecture can be the baseline of an ablation and every variant can be checked
against transformers' own implementation.

    from lm_ablate.hf import from_hf
    model, cfg = from_hf(hf_model)          # TransformerLM (eval mode) and the lm-ablate config it was built from

Each supported family registers a converter in ``CONVERTERS`` (lm_ablate/hf/registry.py) under its transformers
``model_type``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from lm_ablate.hf import gpt_like, llama_like  # noqa: F401  (registers the converters)
from lm_ablate.hf.registry import CONVERTERS


def from_hf(hf_model: Any) -> tuple[Any, DictConfig]:
    """The lm-ablate TransformerLM equal to ``hf_model`` (a transformers *ForCausalLM), and its config."""
    model_type = hf_model.config.model_type
    if model_type not in CONVERTERS.names():
        raise ValueError(f"hf model_type={model_type!r} is not supported: allowed: {', '.join(CONVERTERS.names())}")
    converter: Callable = CONVERTERS.get(model_type)
    return converter(hf_model)


def supported() -> list[str]:
    return CONVERTERS.names()
