"""What the llama.cpp reach tests share: a committed reference (scripts/make_*_reference.py: llama.cpp's
last-position logits for tiny random files under its four settings, flash attention on/off x f32/f16 KV), the
files written again byte for byte, and the rule miro's logits are held to.

The rule: within SPREAD_MULTIPLE x llama.cpp's own spread across its settings, plus, for a quantized file, an
allowance for the 8-bit rounding of a quantized matmul's activations, which every llama.cpp setting shares and
so leaves out of its spread: miro's native kernels round as llama.cpp does, its f32 weights do not round at all.
Where llama.cpp's four settings agree exactly (qwen2-yarn4-Q8_0 at 2,500 tokens: spread 0), miro native lands
on the same bits and miro f32 0.021 away.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from fixture_files import FIXTURES
from gguf_factory import write_tiny_model

SPREAD_MULTIPLE = 1.5
ACTIVATION_ROUNDING = {"native": 0.02, "f32": 0.03}  # weights -> allowance on a quantized file
# KV-cache blocks of a reach test's engine (num_kv_blocks): 8,192 tokens, the three prompts (2,820 tokens) twice
# over, so each stays in the prefix cache as before; the default 1 GiB is some 262,144 blocks of a tiny file's KV,
# about 0.25 CPU s to build per engine and a heap every garbage collection then walks
KV_BLOCKS = 512


class Reference:
    """tests/fixtures/{stem}.json and .npz: the prompts, the settings, and per variant its file's sha256 and
    llama.cpp's spread."""

    def __init__(self, stem: str):
        self.meta = json.loads((FIXTURES / f"{stem}.json").read_text())
        self.logits = np.load(FIXTURES / f"{stem}.npz")
        self.variants = {v["name"]: v for v in self.meta["variants"]}
        self.prompts = self.meta["prompts"]

    def write_files(self, folder: Path, variant_kwargs: Callable[[str, str], dict]) -> dict[str, Path]:
        """Every variant's file, written again: the bytes llama.cpp ran, or the test stops here."""
        out = {}
        for name, v in self.variants.items():
            info = write_tiny_model(folder / f"{name}.gguf", **variant_kwargs(v["variant"], v["tensor_type"]))
            digest = hashlib.sha256(info["path"].read_bytes()).hexdigest()
            assert digest == v["sha256"], f"{name}: not the file llama.cpp ran"
            out[name] = info["path"]
        return out

    def cases(self) -> list:
        """(variant, weights) pairs: f32 on every file, native too on a quantized one."""
        return [
            pytest.param(name, weights, id=f"{name}-{weights}")
            for name, v in self.variants.items()
            for weights in (("f32", "native") if v["tensor_type"] != "F32" else ("f32",))
        ]

    def allowed(self, name: str, i: int, weights: str) -> float:
        v = self.variants[name]
        rounding = 0.0 if v["tensor_type"] == "F32" else ACTIVATION_ROUNDING[weights]
        return SPREAD_MULTIPLE * v["spread_vs_reference"][i] + rounding

    def check_last_logits(self, engine, name: str, weights: str) -> None:
        """engine's logits after each prompt against llama.cpp's reference setting, within `allowed`."""
        v = self.variants[name]
        for i, prompt in enumerate(self.prompts):
            diff = float(
                np.abs(engine.logits(prompt) - self.logits[f"{name}/{self.meta['reference_setting']}/p{i}"]).max()
            )
            spread = v["spread_vs_reference"][i]
            print(f"{name} {weights} p{i} ({len(prompt)} tokens): {diff:.5f} (llama.cpp's spread {spread:.5f})")
            assert diff <= self.allowed(name, i, weights), (
                f"{name} {weights}: prompt of {len(prompt)} tokens off by {diff:.4f}, more than {SPREAD_MULTIPLE}x "
                f"llama.cpp's own spread ({spread:.4f}) and the activation rounding allowed"
            )
