"""One module per architecture, chosen by a GGUF's general.architecture.

An architecture's class reads its config (`read_config`), loads and checks its tensors (`load`) and runs
one packed step (`forward`); the model runner and the engine know nothing else about it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from gguf import Keys

from miro.core.loading.model_config import ModelConfig
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_check import check_metadata
from miro.core.loading.weights import TensorSpec, check_tensors
from miro.core.engine.kv_cache import KVCache
from miro.core.engine.step_input import StepInput
from miro.core.models.bert import BertModel
from miro.core.models.gemma2 import Gemma2Model
from miro.core.models.gemma3 import Gemma3Model
from miro.core.models.gpt_oss import GptOssModel
from miro.core.models.llama import (
    GraniteModel,
    GraniteMoeModel,
    LlamaModel,
    Mistral3Model,
    OlmoeModel,
    Qwen2Model,
    Qwen3Model,
    Qwen3MoeModel,
    SmolLM3Model,
)
from miro.core.models.nomic_bert import NomicBertModel
from miro.core.models.olmo2 import Olmo2Model
from miro.core.models.phi3 import Phi3Model


class Model(Protocol):
    config: ModelConfig
    metadata_keys: frozenset[str]  # the {arch}.* keys (gguf.Keys templates) it reads beyond ModelConfig's
    weight_format: str  # "f32" (matrices dequantized once) or "native" (kept as stored, llama.cpp's kernels)
    batch_invariant: bool  # every row's logits bitwise independent of the rest of the batch (fixed at load)

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig: ...

    @classmethod
    def tensor_specs(cls, gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        """Every tensor the architecture reads (optional ones marked), with the shape `config` implies."""
        ...

    @classmethod
    def load(
        cls, gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32", batch_invariant: bool = False
    ) -> "Model": ...

    @property
    def weight_memory(self) -> int:
        """Bytes the weights hold of their own; a view of the memory-mapped file holds none."""
        ...

    @property
    def weight_fallbacks(self) -> list[str]:
        """One sentence per tensor type kept as f32 although "native" was asked for (no native kernel)."""
        ...

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Write the step's K/V into `cache`; return float32 logits (len(step.logit_rows), vocab).
        (A decoder; an encoder, config.causal False, has `encode(EncoderInput)` instead: models/bert.py,
        nomic_bert.py.)"""
        ...


MODELS: dict[str, type[Model]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "gemma3": Gemma3Model,
    "bert": BertModel,
    "smollm3": SmolLM3Model,
    "granite": GraniteModel,
    "olmo2": Olmo2Model,
    "mistral3": Mistral3Model,
    "phi3": Phi3Model,
    "gemma2": Gemma2Model,
    "qwen3moe": Qwen3MoeModel,
    "olmoe": OlmoeModel,
    "granitemoe": GraniteMoeModel,
    "nomic-bert": NomicBertModel,
    "gpt-oss": GptOssModel,
}


def model_class(architecture: str) -> type[Model]:
    """The class that runs `architecture`; an architecture miro does not run is one sentence naming it."""
    if not isinstance(architecture, str) or architecture not in MODELS:
        raise ModelFileError(f"architecture {architecture!r} is not supported (supported: {', '.join(MODELS)}).")
    return MODELS[architecture]


def read_config(gguf: GGUFFile) -> ModelConfig:
    """The file's config, read by its architecture's class (no tensor is touched)."""
    architecture = gguf.require(Keys.General.ARCHITECTURE)
    try:
        cls = model_class(architecture)
    except ModelFileError as err:
        raise ModelFileError(f"{gguf.path}: {err}") from None
    config = cls.read_config(gguf)
    check_metadata(gguf, architecture, cls.metadata_keys)
    return config


def check_model_file(gguf: GGUFFile) -> ModelConfig:
    """Everything miro checks of a file before reading a weight: its config, its keys and its tensors (names,
    types, shapes); the one sentence why not as a ModelFileError."""
    config = read_config(gguf)
    cls = model_class(config.architecture)
    check_tensors(gguf, cls.tensor_specs(gguf, config), config.architecture)
    return config


def load_model(
    gguf: GGUFFile, config: ModelConfig | None = None, weight_format: str = "f32", batch_invariant: bool = False
) -> Model:
    """The model a GGUF file holds, its tensors checked against the architecture's list, then loaded with
    its matrices in `weight_format` ("f32" or "native"); f32 matrices packed for the batch-invariant GEMM
    when `batch_invariant`, else laid out for OpenBLAS."""
    config = config or read_config(gguf)
    return model_class(config.architecture).load(gguf, config, weight_format, batch_invariant)
