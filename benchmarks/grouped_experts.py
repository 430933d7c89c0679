"""The grouped expert kernel alone, against the same experts run one at a time through the dense kernels.

    python benchmarks/grouped_experts.py [--model MOE.gguf] [--layers 0,2] [--rows 48,256] [--repeats 20]
                                         [--threads 1] [--tier avx2]

For each chosen layer of a mixture-of-experts file (default: moe.py's Qwen3-MoE-shaped Q4_K_M, 64 experts of
512, 8 active), `--rows` rows of random activations are routed at random (8 distinct experts a row, seeded), as
a decode step of 48 sequences or a prefill chunk of 256 tokens spreads them, and two ways of running the slots
are timed on the same inputs, in turn:
- grouped: `GroupedExperts.product` (core/layers/moe.py): every active expert's gate and up in one call, then
  their down in one call (the activations quantized once, the rows gathered; what the engine runs);
- one by one: each active expert's rows through a `Linear` of that expert's gate+up (fused, as the engine did
  before the grouped kernel) and one of its down, the matrices repacked the same way.
Each figure is the least of --repeats calls (one thread by default: the kernels' own speed, steady on a shared
machine); GMAC/s counts the multiply-adds of the slots' rows (rows x 8 x the matrix). The script checks that
both ways give the same bits (they must: the grouped kernel is batch-invariant and takes the dense kernels'
integer sums and float steps), and prints the load average. Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

import tiers  # noqa: E402
from quant_linear import median_seconds  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/miro/bench/qwen3moe-16-1024-16-4-128-64-8-512-32000-q4_k_m.gguf"
ACTIVE = 8  # experts a row


def routed(n_rows: int, n_expert: int, rng: np.random.Generator):
    """(source row of each slot in expert order, starts, active): moe._run_grouped's arguments for a random routing."""
    chosen = np.stack([rng.choice(n_expert, ACTIVE, replace=False) for _ in range(n_rows)]).astype(np.int32)
    flat = chosen.reshape(-1)
    order = np.argsort(flat, kind="stable")
    starts = np.zeros(n_expert + 1, np.int32)
    np.cumsum(np.bincount(flat, minlength=n_expert), out=starts[1:])
    active = np.flatnonzero(np.diff(starts)).astype(np.int32)
    return order // ACTIVE, starts, active


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--layers", default="0,2")
    parser.add_argument("--rows", default="48,256")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, with_llama=False))
    if not Path(args.model).exists():
        raise SystemExit(f"{args.model}: no such file (benchmarks/moe.py makes the default one)")

    from numba import set_num_threads

    from miro.core.kernels import cpu
    from miro.core.layers.linear import Linear, LinearStack
    from miro.core.layers.moe import GroupedExperts, expert_slab
    from miro.core.loading.gguf_file import GGUFFile

    set_num_threads(args.threads)
    tier = cpu.TIER
    gguf = GGUFFile(args.model)
    rng = np.random.default_rng(0)
    print(
        f"{Path(args.model).name}: {args.threads} thread(s), least of {args.repeats} calls; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        f"  {'layer':<6} {'types':<10} {'rows':>5} {'stage':<8} {'grouped ms':>10} {'GMAC/s':>7} "
        f"{'one by one ms':>13} {'GMAC/s':>7} {'speed-up':>8}  same bits"
    )
    for layer in (int(v) for v in args.layers.split(",")):
        gate, up, down = (gguf.tensors[f"blk.{layer}.ffn_{name}_exps.weight"] for name in ("gate", "up", "down"))
        n_expert, width, dim = gate.shape
        singles = [
            (
                LinearStack([Linear(expert_slab(gate, e), tier=tier.name), Linear(expert_slab(up, e), tier=tier.name)]),
                Linear(expert_slab(down, e), tier=tier.name),
            )
            for e in range(n_expert)
        ]
        grouped = GroupedExperts(gate, up, down, tier)
        types = f"{gate.type.name}/{down.type.name}"
        for n_rows in (int(v) for v in args.rows.split(",")):
            x = rng.standard_normal((n_rows, dim)).astype(np.float32)
            source, starts, active = routed(n_rows, n_expert, rng)
            act = rng.standard_normal((len(source), width)).astype(np.float32)

            def one_by_one(stage):
                out = np.empty((len(source), 2 * width if stage == "gate+up" else dim), np.float32)
                for e in active:
                    rows = slice(starts[e], starts[e + 1])
                    if stage == "gate+up":
                        out[rows] = singles[e][0](x[source[rows]])
                    else:
                        out[rows] = singles[e][1](act[rows])
                return out

            stages = {
                "gate+up": lambda: grouped.product(grouped.gate, grouped.up, x, source, starts, active),
                "down": lambda: grouped.product(grouped.down, grouped.down, act, None, starts, active),
            }
            for stage, run_grouped in stages.items():
                same = np.array_equal(run_grouped(), one_by_one(stage))
                grouped_s = median_seconds([run_grouped], args.repeats, "min")
                single_s = median_seconds([lambda: one_by_one(stage)], args.repeats, "min")
                macs = len(source) * dim * width * (2 if stage == "gate+up" else 1)
                print(
                    f"  {layer:<6} {types:<10} {n_rows:>5} {stage:<8} {grouped_s * 1e3:10.3f} {macs / grouped_s / 1e9:7.1f}"
                    f" {single_s * 1e3:13.3f} {macs / single_s / 1e9:7.1f} {single_s / grouped_s:7.2f}x  "
                    f"{'yes' if same else 'NO'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
