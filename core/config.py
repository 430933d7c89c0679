"""Model hyper-parameters read from GGUF metadata. A missing key is an error, never a default."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelFileError
from .gguf_file import GGUFFile

SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "ModelConfig":
        arch = gguf.require("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFileError(
                f"{gguf.path}: architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})."
            )

        def key(name: str):
            return gguf.require(f"{arch}.{name}")

        dim = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        n_kv_heads = int(gguf.get(f"{arch}.attention.head_count_kv", n_heads))
        if dim % n_heads or n_heads % n_kv_heads:
            raise ModelFileError(
                f"{gguf.path}: {n_heads} heads and {n_kv_heads} KV heads do not divide embedding size {dim}."
            )
        head_dim = dim // n_heads
        rope_dim = int(gguf.get(f"{arch}.rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise ModelFileError(f"{gguf.path}: partial RoPE ({rope_dim} of {head_dim} dims) is not supported.")
        tokens = gguf.require("tokenizer.ggml.tokens")
        vocab_size = int(gguf.get(f"{arch}.vocab_size", len(tokens)))
        return cls(
            architecture=arch,
            n_layers=int(key("block_count")),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            ffn_dim=int(key("feed_forward_length")),
            vocab_size=vocab_size,
            context_length=int(key("context_length")),
            rope_theta=float(gguf.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        )
