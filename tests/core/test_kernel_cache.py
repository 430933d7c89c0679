"""numba's on-disk cache and the kernels a factory makes once per weight type.

numba names a compiled function's environment (the Python objects it needs at run time, such as the
dtype of an array it returns) after the function's qualname, its argument types and a counter local to
the compiling process. Two weight types' kernels of one qualname, cached by two processes at the same
counter value, got the same name; a process loading both then ran one with the other's environment
and failed with "In 'NRT_adapt_ndarray_to_python', 'descr' is NULL" (seen with gemma3-270m, whose
Q4_K and Q6_K matrices share the lanes kernel). Each variant's qualname now names its weight type.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from miro.core.layers import cpu, quant_kernels, tile_kernels, vnni_kernels
from miro.core.layers.linear import NATIVE_TYPES
from miro.core.layers.float_kernels import FLOAT_TYPES


def test_each_weight_types_kernels_have_their_own_qualnames():
    qualnames = {}
    for qtype in sorted(set(NATIVE_TYPES) - set(FLOAT_TYPES)):
        kernels = quant_kernels.kernels_for(qtype, cpu.TIER)
        for kernel in (kernels.lanes, kernels.rows, kernels.lanes_vnni, kernels.tiles):
            if kernel is not None:
                name = kernel.py_func.__qualname__
                assert Q(qtype).name in name
                assert name not in qualnames, f"{Q(qtype).name} and {qualnames.get(name)} share {name}"
                qualnames[name] = Q(qtype).name
    assert len(qualnames) >= 2 * 8


def test_every_tiers_factories_name_their_weight_type_and_tier():
    """The kernels of every tier, whatever this CPU runs; their factories are checked directly."""
    names = {vnni_kernels.lanes_k(int(q)).py_func.__qualname__ for q in (Q.Q4_K, Q.Q5_K, Q.Q6_K)}
    int8_tiers = [tier for tier in cpu.TIERS.values() if tier.int8_dot]
    shapes = [(tier, tokens) for tier in int8_tiers for tokens in ((8, 2) if tier.vector_bits == 512 else (2,))]
    names |= {tile_kernels.tiles_32(int(q), tier, tokens).py_func.__qualname__ for q in cpu.TILE_TYPES
              for tier, tokens in shapes}
    assert len(names) == 3 + len(cpu.TILE_TYPES) * len(shapes)
