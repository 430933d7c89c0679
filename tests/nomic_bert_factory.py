"""A tiny random nomic-bert GGUF (nomic-embed-text v1/v1.5's layout) in llama.cpp's form, for tests and
scripts/make_nomic_bert_reference.py.

What llama.cpp's convert_hf_to_gguf.py writes for nomic-embed-text (NomicBertModel): token_embd,
token_types (2 rows), token_embd_norm weight and bias; per block a fused attn_qkv, attn_output, the
LayerNorms attn_output_norm and layer_output_norm (weight and bias), and SwiGLU's ffn_up, ffn_gate and
ffn_down, without a bias anywhere else; no position embeddings (RoPE, NEOX, rope.freq_base 1000). Keys:
the sizes, attention.layer_norm_epsilon, attention.causal false, pooling_type 1 (mean), rope.freq_base,
tokenizer.ggml.token_type_count 2 (llama.cpp refuses a nomic-bert file without it), and a WordPiece vocabulary
(tokenizer.ggml.model "bert") in llama.cpp's phantom-space form. The vocabulary here is tiny: the special
tokens, a few words, every letter and digit as a word start and as a continuation, and punctuation, so
English text tokenizes to about one token per character, and a few hundred tokens are a paragraph.
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from gguf_factory import encode_weight, tensor_name, to_float

MT = gguf.MODEL_TENSOR
ARCH = "nomic-bert"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
WORDS = [
    "the",
    "and",
    "of",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "model",
    "text",
    "search",
    "query",
    "document",
    "embedding",
    "rotary",
    "position",
]
PIECES = ["ing", "ed", "er", "es", "ly", "tion", "th", "he", "an", "re"]  # continuations


def tiny_wordpiece_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token_types) in llama.cpp's phantom-space form: "\u2581word" starts a word, "ing" continues one."""
    starts = WORDS + list(string.ascii_lowercase) + list(string.digits) + list(string.punctuation)
    tokens = SPECIALS + ["\u2581" + w for w in starts] + PIECES + list(string.ascii_lowercase + string.digits)
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIALS) + [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIALS))
    assert len(set(tokens)) == len(tokens)
    return tokens, types


def layer_shapes(i: int, dim: int, ffn_dim: int) -> dict[str, tuple[int, ...]]:
    """Block i's tensors, (out, in), in llama.cpp's converter's order."""
    t = lambda kind, suffix="weight": tensor_name(kind, i, suffix)  # noqa: E731
    return {
        t(MT.ATTN_QKV): (3 * dim, dim),
        t(MT.ATTN_OUT): (dim, dim),
        t(MT.ATTN_OUT_NORM): (dim,),
        t(MT.ATTN_OUT_NORM, "bias"): (dim,),
        t(MT.FFN_UP): (ffn_dim, dim),
        t(MT.FFN_GATE): (ffn_dim, dim),
        t(MT.FFN_DOWN): (dim, ffn_dim),
        t(MT.LAYER_OUT_NORM): (dim,),
        t(MT.LAYER_OUT_NORM, "bias"): (dim,),
    }


def write_tiny_nomic_bert(
    path,
    *,
    tensor_type: str = "F32",
    n_layers: int = 2,
    dim: int = 64,
    n_heads: int = 4,
    ffn_dim: int = 128,
    context_length: int = 512,
    rope_theta: float = 1000.0,
    norm_eps: float = 1e-12,
    seed: int = 0,
    weight_scale: float = 0.25,
    arch_name: str = ARCH,
    token_types: bool = True,
    rope_scaling: dict | None = None,
    tensor_overrides: dict | None = None,
    metadata: dict | None = None,
    drop_tensors=(),
) -> dict:
    """Write the file; matrices (token_embd too) in ``tensor_type`` (F32, F16, BF16, Q8_0, ...), norms F32.

    Matrices are ``weight_scale`` * N(0, 1) (0.25: q.k over a LayerNormed input is several units, so
    attention is far from uniform and where each key sits matters), embeddings N(0, 1), norm weights
    1 + 0.1 N(0, 1), norm biases 0.1 N(0, 1). Seeded, no timestamps: the same arguments give the same
    bytes. ``rope_scaling`` {"type": "linear" or "yarn", "factor": f, "original_context_length": n (yarn)}
    writes the rope.scaling keys as llama.cpp's converter types them. ``tensor_overrides`` (name -> float32
    array, written F32), ``drop_tensors`` and ``metadata`` (key -> GGUFValue or value; None deletes it) change
    the file for refusal tests. Returns the config and ``tensors``: name ->
    float32 (out, in) dequantized from the bytes written."""
    rng = np.random.default_rng(seed)
    tokens, types = tiny_wordpiece_vocab()
    shapes = {tensor_name(MT.TOKEN_EMBD): (len(tokens), dim)}
    if token_types:
        shapes[tensor_name(MT.TOKEN_TYPES)] = (2, dim)
    shapes[tensor_name(MT.TOKEN_EMBD_NORM)] = (dim,)
    shapes[tensor_name(MT.TOKEN_EMBD_NORM, suffix="bias")] = (dim,)
    for i in range(n_layers):
        shapes.update(layer_shapes(i, dim, ffn_dim))

    stored: dict[str, tuple[np.ndarray, QT | None]] = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            base = 0.0 if name.endswith(".bias") else 1.0
            stored[name] = ((base + 0.1 * rng.standard_normal(shape)).astype(np.float32), None)
            continue
        scale = 1.0 if name.startswith(("token_embd", "token_types")) else weight_scale
        w = (scale * rng.standard_normal(shape)).astype(np.float32)
        if name == tensor_name(MT.TOKEN_TYPES):  # llama.cpp adds row 0 as a view: keep it float
            stored[name] = (w, None)
            continue
        raw = encode_weight(w, tensor_type, rng)
        stored[name] = (raw, QT[tensor_type] if raw.dtype == np.uint8 else None)
    for name, value in (tensor_overrides or {}).items():
        stored[name] = (np.asarray(value, np.float32), None)
    for name in drop_tensors:
        del stored[name]

    w = gguf.GGUFWriter(str(path), arch_name)
    w.add_name("tiny-nomic-bert-test")
    w.add_context_length(context_length)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_block_count(n_layers)
    w.add_head_count(n_heads)
    w.add_layer_norm_eps(norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_rope_freq_base(rope_theta)
    if rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling["type"]))
        w.add_rope_scaling_factor(rope_scaling["factor"])
        if "original_context_length" in rope_scaling:
            w.add_rope_scaling_orig_ctx_len(rope_scaling["original_context_length"])
    w.add_file_type(
        gguf.LlamaFileType.ALL_F32
        if tensor_type == "F32"
        else gguf.LlamaFileType.MOSTLY_F16
        if tensor_type == "F16"
        else gguf.LlamaFileType.MOSTLY_Q8_0
        if tensor_type == "Q8_0"
        else gguf.LlamaFileType.GUESSED
    )
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(CLS_ID)
    w.add_sep_token_id(SEP_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_mask_token_id(MASK_ID)
    for key, value in (metadata or {}).items():
        if value is None:
            del w.kv_data[0][key]
        elif isinstance(value, gguf.GGUFValue):
            w.kv_data[0][key] = value
        else:
            w.kv_data[0][key] = gguf.GGUFValue(value, gguf.GGUFValueType.get_type(value))
    for name, (raw, raw_dtype) in stored.items():
        w.add_tensor(name, raw, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tensors = {
        name: to_float(
            raw,
            raw_dtype
            if raw_dtype is not None
            else {np.dtype(np.float32): QT.F32, np.dtype(np.float16): QT.F16}[raw.dtype],
        )
        for name, (raw, raw_dtype) in stored.items()
    }
    return dict(
        path=Path(path),
        arch=arch_name,
        tensor_type=tensor_type,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        head_dim=dim // n_heads,
        ffn_dim=ffn_dim,
        context_length=context_length,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        norm_eps=norm_eps,
        vocab_size=len(tokens),
        tokens=tokens,
        tensors=tensors,
    )
