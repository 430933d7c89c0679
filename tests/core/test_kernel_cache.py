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

from miro.core.kernels import cpu
from miro.core.kernels.weight_types import WEIGHT_TYPES


def test_each_weight_types_kernels_have_their_own_qualnames():
    qualnames = {}
    for qtype, row in WEIGHT_TYPES.items():
        if row.is_float or not row.native:
            continue
        kernels = row.kernels_on(cpu.TIER)
        for kernel in (kernels.lanes, kernels.rows, kernels.tiles):
            if kernel is not None:
                name = kernel.py_func.__qualname__
                assert Q(qtype).name in name
                assert name not in qualnames, f"{Q(qtype).name} and {qualnames.get(name)} share {name}"
                qualnames[name] = Q(qtype).name
    assert len(qualnames) >= 2 * 8


def test_every_tiers_factories_name_their_weight_type_and_tier():
    """The kernels of every tier, whatever this CPU runs; their factories are checked directly."""
    int8_tiers = [tier for tier in cpu.TIERS.values() if tier.int8_dot]
    names = set()
    expected = 0
    for qtype, row in WEIGHT_TYPES.items():
        if not row.native or row.kernels.tiles is None:
            continue
        factory = row.kernels.tiles
        for tier in int8_tiers:
            for tokens in {2, row.plan(tier).tile_tokens}:
                names.add(factory(int(qtype), tier, tokens).py_func.__qualname__)
                expected += 1
    assert len(names) == expected
