"""miro.core: the inference engine (GGUF loading, tokenizer, forward pass, sampling). No Redis here."""

import os

# OpenBLAS's and numba's thread pools spin while idle and fight over the cores
# (a decode step went from ~0.2 s to ~1.2 s on 2 cores), so neither spins for long.
# But a pool that sleeps at once pays a wake-up on every parallel kernel: 70-90 us
# on a 2-core VM, and a decode step runs hundreds of kernels back to back (the 48
# ShareGPT prompts of benchmarks/vllm_cpu.py: 678 tok/s). GOMP_SPINCOUNT keeps
# numba's OpenMP threads (libgomp) spinning for about 0.2-1 ms after a kernel
# before they sleep: a step's kernels find them awake (907 tok/s), and a worker
# idle between steps still sleeps. These only take effect when set before numpy
# and numba start their pools; users may override them.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "30000")

from miro.core.engine.engine_config import EngineConfig  # noqa: E402
from miro.core.errors import MiroError, ModelFileError, RequestError  # noqa: E402
from miro.core.engine.outputs import CompletionOutput, RequestOutput  # noqa: E402
from miro.core.layers.pooling import PoolingParams  # noqa: E402
from miro.core.sampling.params import SamplingParams  # noqa: E402

__all__ = [
    "Engine",
    "EngineConfig",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "PoolingParams",
    "MiroError",
    "ModelFileError",
    "RequestError",
]


def __getattr__(name: str):
    """`Engine` loads numba and the kernels: only when asked for, so that the commands that only talk to Redis
    (submit, status, watch, cancel, retry, results) start without them."""
    if name == "Engine":
        from miro.core.engine.engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
