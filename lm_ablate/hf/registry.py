"""The converters of the supported Hugging Face families, by transformers ``model_type``: each family module
(gpt_like, llama_like) registers its own; lm_ablate/hf/__init__.py dispatches on them."""

from __future__ import annotations

from lm_ablate.registry import Registry

# model_type -> converter(hf_model) -> (TransformerLM, DictConfig)
CONVERTERS: Registry = Registry("hf.model_type")
