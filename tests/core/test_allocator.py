"""core/engine/allocator.py: once set, a step's large temporaries come back from the heap instead of fresh pages
(glibc), and an Engine sets it."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHILD = """
import resource, sys
import numpy as np
from miro.core.engine import allocator

def faults_per_cycle():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):  # a run's temporaries: four arrays of 4 MB written, all freed, written again
        arrays = [np.empty(1 << 20, np.float32) for _ in range(4)]
        for a in arrays:
            a.fill(1.0)
        del arrays, a
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20

fresh = faults_per_cycle()
assert allocator.keep_step_memory() and allocator.keep_step_memory()  # once, and again a no-op
faults_per_cycle()  # the first array after the setting takes its pages once
kept = faults_per_cycle()
print(fresh, kept)
"""


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc", reason="glibc's mallopt")
def test_a_freed_temporary_is_not_faulted_in_again():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout.split()
    fresh, kept = (float(v) for v in out)
    # glibc without the setting: its mmap threshold slides up to 4 MB, its trim threshold to 8 MB, and the 16 MB
    # freed at the heap's top goes back to the system: the pages faulted in again every cycle
    assert fresh >= 4
    assert kept < 1


def test_an_engine_sets_it(tmp_path):
    from miro.core import Engine
    from miro.core.engine import allocator
    from gguf_factory import write_tiny_llama

    Engine.from_model(str(write_tiny_llama(tmp_path / "tiny.gguf")["path"]))
    assert allocator._set == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
