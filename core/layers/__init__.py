"""Linear layers over GGUF tensors kept as stored (memory-mapped blocks) or dequantized once."""

from .linear import NATIVE_TYPES, Linear

__all__ = ["Linear", "NATIVE_TYPES"]
