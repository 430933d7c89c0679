"""`miro warmup`: fill numba's cache ahead of any run, for a model on this CPU (the units compile_ahead.py plans,
then a short rehearsal for whatever no unit covers). Apart from compile_ahead.py, which the engine imports, because
this module loads an Engine."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from miro.core.engine.compile_ahead import CompileCounter


@dataclass(frozen=True)
class WarmUp:
    """What `warm_up` did: the kernel families compiled ahead, the kernels the rehearsal compiled on first use
    (what no unit covers), the seconds."""

    ahead: int
    first_use: tuple[str, ...]
    seconds: float


def warm_up(name_or_path: str, log: Callable[[str], None] = lambda m: None, **options) -> WarmUp:
    """Fill numba's cache with every kernel a run of this model calls on this CPU: the units compiled ahead in
    parallel as a load does, then a rehearsal (a short and a long prompt, greedy, sampled and constrained; or
    inputs to embed) that compiles, on first use, whatever no unit covers."""
    from miro.core.engine.engine import Engine
    from miro.core.sampling.params import SamplingParams
    from miro.core.sampling.constraint import StructuredOutputsParams

    started = time.perf_counter()
    counter = CompileCounter()
    try:
        engine = Engine.from_model(name_or_path, log=log, **options)
        ahead = engine.compiled_ahead
        counter.names.clear()  # the load's own (the repacking) are not the rehearsal's
        if "embed" in engine.supported_tasks:
            engine.embed(["a short input", " ".join(["a longer input"] * 12)], use_tqdm=False)
        else:
            vocab = engine.config.vocab_size
            short, long = [1, 2], [1 + i % (vocab - 1) for i in range(40)]  # a decode row; past every tile pass
            engine.generate(
                [short, long, short, long],
                [
                    SamplingParams(max_tokens=2, temperature=0),
                    SamplingParams(max_tokens=2, temperature=0),
                    SamplingParams(max_tokens=2, temperature=0.8, top_p=0.9, seed=1),
                    SamplingParams(
                        max_tokens=2, temperature=0, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])
                    ),
                ],
                use_tqdm=False,
            )
    finally:
        counter.close()
    return WarmUp(ahead, tuple(counter.names), time.perf_counter() - started)
