"""Linear layers over GGUF tensors kept as stored (memory-mapped blocks) or dequantized once."""

from .linear import Linear
from .weight_types import NATIVE_TYPES

__all__ = ["NATIVE_TYPES", "Linear"]
