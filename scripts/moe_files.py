"""Tiny random mixture-of-experts GGUFs (issue 41), written with gguf.GGUFWriter in the layouts llama.cpp loads:
a Mixtral-style ``llama`` file with experts, ``qwen3moe``, ``olmoe``, ``granitemoe`` (with and without Granite MoE
Shared's shared expert) and ``gpt-oss`` (MXFP4 experts, attention sinks, biases, alternate sliding layers, YaRN).

``write_moe_model(path, variant, tensor_type)`` writes one; the same arguments give the same bytes (seeded, no
timestamps), so a test rebuilds the exact file scripts/make_moe_reference.py ran through llama.cpp and checks its
sha256 against tests/fixtures/moe_llamacpp.json. Importable from tests with ``scripts`` on sys.path; it puts
``tests`` on sys.path itself for gguf_factory's tiny byte-level BPE vocabulary (272 tokens) and weight encoders.

Types: ``F32`` (every matrix F32), ``F16``, or ``Q8_0`` (gguf-py's quantizer, as gguf_factory uses it). What stays
F32 whatever the type, as llama.cpp's quantizer leaves it: norm weights, biases, attention sinks and the router
(``ffn_gate_inp``: llama-quant.cpp never quantizes it). gpt-oss's expert matrices are MXFP4 in every type, as its
converter stores them (the type then applies to the rest). Shapes follow llama.cpp's loaders
(src/models/{llama,qwen3moe,olmoe,granite-moe,openai-moe}.cpp): expert tensors are (n_expert, rows, cols) in
numpy order, i.e. ggml {cols, rows, n_expert}.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
from gguf_factory import CHAT_TEMPLATE, tensor_name, tiny_vocab  # noqa: E402

MT = gguf.MODEL_TENSOR
TYPES = ("F32", "F16", "Q8_0")
CONTEXT = 4096  # llama.cpp's n_ctx for the references (and miro's max_model_len in the tests)
U32 = gguf.GGUFValueType.UINT32

# Each variant: its architecture, sizes and what its family sets. ffn_dim is feed_forward_length (llama, olmoe and
# granitemoe size their experts by it); expert_ffn_dim is expert_feed_forward_length (qwen3moe, gpt-oss).
VARIANTS = {
    # Mixtral 8x7B's layout at toy size: llama with 8 experts, 2 used; softmax, top-2, renormalised.
    "mixtral": dict(
        arch="llama",
        n_layers=2,
        dim=64,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=128,
        n_expert=8,
        n_expert_used=2,
        rope_theta=1e6,
        rms_eps=1e-5,
        tie=False,
    ),
    # Qwen3-30B-A3B's: head_dim from key_length (not dim / n_heads), per-head q/k RMSNorm, NEOX RoPE, expert width
    # from expert_feed_forward_length (feed_forward_length is there but unused), softmax, top-k, renormalised.
    "qwen3moe": dict(
        arch="qwen3moe",
        n_layers=2,
        dim=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        ffn_dim=192,
        expert_ffn_dim=64,
        n_expert=16,
        n_expert_used=4,
        rope_theta=1e6,
        rms_eps=1e-6,
        tie=False,
    ),
    # OLMoE-1B-7B's: q/k RMSNorm over the whole q and k vectors (so n_kv_heads == n_heads), NEOX RoPE, softmax,
    # top-k, NOT renormalised; output head of its own.
    "olmoe": dict(
        arch="olmoe",
        n_layers=2,
        dim=64,
        n_heads=4,
        n_kv_heads=4,
        ffn_dim=64,
        n_expert=16,
        n_expert_used=4,
        rope_theta=10000.0,
        rms_eps=1e-5,
        tie=False,
    ),
    # Granite 3.x MoE's: granite's four multipliers, llama's graph with softmax top-k renormalised experts.
    "granitemoe": dict(
        arch="granitemoe",
        n_layers=2,
        dim=64,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=64,
        n_expert=8,
        n_expert_used=2,
        rope_theta=10000.0,
        rms_eps=1e-6,
        tie=True,
    ),
    # Granite MoE Shared: the same plus an always-on SwiGLU shared expert of expert_shared_feed_forward_length.
    "granitemoe-shared": dict(
        arch="granitemoe",
        n_layers=2,
        dim=64,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=64,
        shared_ffn_dim=96,
        n_expert=8,
        n_expert_used=2,
        rope_theta=10000.0,
        rms_eps=1e-6,
        tie=True,
    ),
    # gpt-oss-20b's: dim 96 != n_heads x head_dim (128), q/k/v/o biases, per-head attention sinks, even layers slide
    # over 128 positions, YaRN factor 32 over 4,096 (theta 150,000), router with bias, softmax over the chosen k,
    # MXFP4 experts with biases, SwiGLU-OAI (alpha 1.702, clamp 7), post_attention_norm before the experts.
    "gpt-oss": dict(
        arch="gpt-oss",
        n_layers=4,
        dim=96,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        ffn_dim=64,
        expert_ffn_dim=64,
        n_expert=16,
        n_expert_used=4,
        rope_theta=150000.0,
        rms_eps=1e-5,
        tie=False,
        sliding_window=128,
        yarn=(32.0, 4096),
        context_length=131072,
    ),
}
GRANITE_SCALES = dict(logit=2.0, residual=0.5, embedding=2.0, attention=0.0625)  # as gguf_factory's granite
SEED = 41
WEIGHT_SCALE = 0.08
EMBED_SCALE = 0.5  # token_embd: a residual stream of about 0.5 rms, for the blocks to act on
ROUTER_SCALE = 0.5  # router logits of a few units: top-k far from ties, so no setting flips an expert


def _layer_shapes(v: dict, i: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy shape for block i, in the converter's order."""
    arch, dim, hd = v["arch"], v["dim"], v["head_dim"]
    q, kv = v["n_heads"] * hd, v["n_kv_heads"] * hd
    n_exp, ff = v["n_expert"], v.get("expert_ffn_dim") or v["ffn_dim"]
    t = lambda kind, suffix="weight": tensor_name(kind, i, suffix)  # noqa: E731
    s = {t(MT.ATTN_NORM): (dim,), t(MT.ATTN_Q): (q, dim)}
    if arch == "gpt-oss":
        s[t(MT.ATTN_Q, "bias")] = (q,)
    s[t(MT.ATTN_K)] = (kv, dim)
    if arch == "gpt-oss":
        s[t(MT.ATTN_K, "bias")] = (kv,)
    s[t(MT.ATTN_V)] = (kv, dim)
    if arch == "gpt-oss":
        s[t(MT.ATTN_V, "bias")] = (kv,)
    s[t(MT.ATTN_OUT)] = (dim, q)
    if arch == "gpt-oss":
        s[t(MT.ATTN_OUT, "bias")] = (dim,)
        s[t(MT.ATTN_SINKS)] = (v["n_heads"],)
        s[t(MT.ATTN_POST_NORM)] = (dim,)  # gpt-oss's pre-FFN norm is named post_attention_norm
    if arch == "qwen3moe":
        s[t(MT.ATTN_Q_NORM)] = (hd,)
        s[t(MT.ATTN_K_NORM)] = (hd,)
    if arch == "olmoe":
        s[t(MT.ATTN_Q_NORM)] = (q,)
        s[t(MT.ATTN_K_NORM)] = (kv,)
    if arch != "gpt-oss":
        s[t(MT.FFN_NORM)] = (dim,)
    s[t(MT.FFN_GATE_INP)] = (n_exp, dim)
    if arch == "gpt-oss":
        s[t(MT.FFN_GATE_INP, "bias")] = (n_exp,)
    s[t(MT.FFN_GATE_EXP)] = (n_exp, ff, dim)
    s[t(MT.FFN_UP_EXP)] = (n_exp, ff, dim)
    s[t(MT.FFN_DOWN_EXP)] = (n_exp, dim, ff)
    if arch == "gpt-oss":
        s[t(MT.FFN_GATE_EXP, "bias")] = (n_exp, ff)
        s[t(MT.FFN_UP_EXP, "bias")] = (n_exp, ff)
        s[t(MT.FFN_DOWN_EXP, "bias")] = (n_exp, dim)
    if v.get("shared_ffn_dim"):
        sh = v["shared_ffn_dim"]
        s[t(MT.FFN_GATE_SHEXP)] = (sh, dim)
        s[t(MT.FFN_UP_SHEXP)] = (sh, dim)
        s[t(MT.FFN_DOWN_SHEXP)] = (dim, sh)
    return s


def _encode(w: np.ndarray, qtype: str) -> tuple[np.ndarray, QT | None]:
    if qtype == "F32":
        return w.astype(np.float32), None
    if qtype == "F16":
        return w.astype(np.float16), None
    return quantize(w, QT[qtype]), QT[qtype]


def _draw(name: str, shape: tuple[int, ...], v: dict, rng: np.random.Generator) -> np.ndarray:
    """The float32 values of one tensor (before encoding)."""
    if name.endswith("attn_sinks.weight"):  # per head: from no sink at all (-2) to one that outweighs ~400 keys
        return rng.uniform(-2.0, 6.0, shape).astype(np.float32)
    if name.endswith(".bias"):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) == 1:  # norms around 1
        return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    if name == "token_embd.weight":
        return (EMBED_SCALE * rng.standard_normal(shape)).astype(np.float32)
    if "ffn_gate_inp" in name:
        return (ROUTER_SCALE * rng.standard_normal(shape)).astype(np.float32)
    if v["arch"] == "gpt-oss" and ("ffn_gate_exps" in name or "ffn_up_exps" in name):
        # per expert 0.08 .. 0.8: the larger experts' gate and up pass SwiGLU-OAI's clamp at 7
        scales = np.geomspace(0.08, 0.8, shape[0]).astype(np.float32)[:, None, None]
        return (scales * rng.standard_normal(shape)).astype(np.float32)
    if v["arch"] == "gpt-oss" and "ffn_down_exps" in name:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return (WEIGHT_SCALE * rng.standard_normal(shape)).astype(np.float32)


def variant_config(variant: str) -> dict:
    v = dict(VARIANTS[variant])
    v.setdefault("head_dim", v["dim"] // v["n_heads"])
    v.setdefault("context_length", CONTEXT)
    return v


def write_moe_model(path, variant: str, tensor_type: str = "F32") -> dict:
    """Write one variant's tiny random GGUF; returns its config plus ``tensors`` (name -> float32 numpy array,
    dequantized from exactly the bytes written) and ``tensor_types`` (name -> GGML type name)."""
    if tensor_type not in TYPES:
        raise ValueError(f"tensor_type must be one of {TYPES}, got {tensor_type!r}")
    v = variant_config(variant)
    arch = v["arch"]
    rng = np.random.default_rng([SEED, zlib.crc32(variant.encode())])  # per variant, whatever the order
    tokens, token_types, merges = tiny_vocab()
    vocab = len(tokens)

    shapes = {tensor_name(MT.TOKEN_EMBD): (vocab, v["dim"])}
    for i in range(v["n_layers"]):
        shapes.update(_layer_shapes(v, i))
    shapes[tensor_name(MT.OUTPUT_NORM)] = (v["dim"],)
    if not v["tie"]:
        shapes[tensor_name(MT.OUTPUT)] = (vocab, v["dim"])

    stored: dict[str, tuple[np.ndarray, QT | None]] = {}
    for name, shape in shapes.items():
        w = _draw(name, shape, v, rng)
        if len(shape) == 1 or name.endswith(".bias") or "ffn_gate_inp" in name or "attn_sinks" in name:
            stored[name] = (w, None)  # F32 in every type
        elif arch == "gpt-oss" and "_exps." in name:
            stored[name] = (quantize(w, QT.MXFP4), QT.MXFP4)
        else:
            stored[name] = _encode(w, tensor_type)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{variant}-moe-test")
    w.add_block_count(v["n_layers"])
    w.add_context_length(v["context_length"])
    w.add_embedding_length(v["dim"])
    w.add_feed_forward_length(v["ffn_dim"])
    w.add_head_count(v["n_heads"])
    w.add_head_count_kv(v["n_kv_heads"])
    w.add_rope_freq_base(v["rope_theta"])
    w.add_layer_norm_rms_eps(v["rms_eps"])
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(v["head_dim"])
    if v["head_dim"] != v["dim"] // v["n_heads"]:
        w.add_key_length(v["head_dim"])
        w.add_value_length(v["head_dim"])
    w.add_expert_count(v["n_expert"])
    w.add_expert_used_count(v["n_expert_used"])
    if v.get("expert_ffn_dim"):
        w.add_expert_feed_forward_length(v["expert_ffn_dim"])
    if v.get("shared_ffn_dim"):
        w.add_expert_shared_feed_forward_length(v["shared_ffn_dim"])
    if arch == "granitemoe":
        w.add_logit_scale(GRANITE_SCALES["logit"])
        w.add_residual_scale(GRANITE_SCALES["residual"])
        w.add_embedding_scale(GRANITE_SCALES["embedding"])
        w.add_attention_scale(GRANITE_SCALES["attention"])
    if arch == "gpt-oss":
        factor, original = v["yarn"]
        w.add_sliding_window(v["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_yarn_beta_fast(32.0)  # gpt-oss's config values (llama.cpp's defaults; it reads neither)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, (raw, raw_dtype) in stored.items():
        w.add_tensor(name, raw, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tensors, types = {}, {}
    for name, (raw, raw_dtype) in stored.items():
        qt = (
            raw_dtype
            if raw_dtype is not None
            else {np.dtype(np.float32): QT.F32, np.dtype(np.float16): QT.F16}[raw.dtype]
        )
        tensors[name] = np.array(dequantize(raw, qt), dtype=np.float32)
        types[name] = qt.name
    return dict(
        path=Path(path),
        variant=variant,
        tensor_type=tensor_type,
        vocab_size=vocab,
        **v,
        tensors=tensors,
        tensor_types=types,
    )
