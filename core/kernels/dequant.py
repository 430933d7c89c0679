"""Turn a GGUF tensor's raw bytes into a float32 numpy array, once, at load.

Each type's dequantizer is its row's in the table of weight types (core/kernels/weight_types.py): vectorised
numpy for the default model's types (Q4_1, Q8_0) and Q4_0, about twice as fast as gguf-py's generic code and
bitwise equal to it; `gguf.quants.dequantize` for the others.
"""

from __future__ import annotations

from miro.core.kernels.weight_types import SUPPORTED_TYPES, dequantize

__all__ = ["SUPPORTED_TYPES", "dequantize"]
