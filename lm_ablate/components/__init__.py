"""Model components, one axis per module. Importing this package registers every option."""

from lm_ablate.components import attention, blocks, ffn, norm, placement, position  # noqa: F401
