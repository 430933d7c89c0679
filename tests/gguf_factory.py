"""Tiny, real GGUF files for unit tests, written with ``gguf.GGUFWriter``.

``write_tiny_model`` writes a valid miniature llama, qwen2, qwen3, gemma3, smollm3, granite, olmo2 or mistral3 model
(random weights, a small byte-level BPE vocab, ChatML template) and returns what it
wrote, including the float32 dequantization of every tensor, so loader tests can
compare against it; ``write_tiny_llama`` is its llama case (tests/fixtures/arch_llamacpp.*
holds llama.cpp's logits for the files scripts/make_arch_reference.py writes with it).
Files broken in one known way, and byte-patched copies of a real file, are broken_gguf.py's.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quant_shape_to_byte_shape, quantize

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "Q4_K", "Q5_K", "Q6_K")
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# Types gguf-py (0.19) cannot quantize: raw blocks built by hand instead. Each entry is
# the byte offsets of the block's fp16 scale fields and the value written there
# (random bytes elsewhere), chosen so dequantized values stay within about +-1.
_HAND_BUILT = {
    "Q4_K": {0: 2.0**-12, 2: 2.0**-9},  # d, dmin | scales[12] | qs[128]  (144 B)
    "Q5_K": {0: 2.0**-13, 2: 2.0**-9},  # d, dmin | scales[12] | qh[32] | qs[128]  (176 B)
    "Q6_K": {208: 2.0**-15},  # ql[128] | qh[64] | scales[16] int8 | d  (210 B)
    "Q2_K": {80: 2.0**-8, 82: 2.0**-8},  # scales[16] | qs[64] | d, dmin  (84 B)
    "IQ2_XXS": {0: 2.0**-8},  # d | qs[64]  (66 B)
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "l l", "Ġ w", "o r", "he ll", "hell o", "Ġw or", "Ġwor l", "Ġworl d", "Ġt he", "i n", "Ġ a"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode mapping (same order as GPT-2's vocab)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges): 3 control tokens, 256 byte symbols, one token per merge."""
    tokens = SPECIAL_TOKENS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(gguf.TokenType.NORMAL)] * (
        len(tokens) - len(SPECIAL_TOKENS)
    )
    assert len(set(tokens)) == len(tokens)
    return tokens, types, list(MERGES)


def random_blocks(qtype: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Valid raw uint8 blocks of a type for a logical (out, in) shape: random payload, small fp16 scales."""
    byte_shape = quant_shape_to_byte_shape(shape, QT[qtype])
    block_bytes = gguf.GGML_QUANT_SIZES[QT[qtype]][1]
    raw = rng.integers(0, 256, size=(int(np.prod(byte_shape)) // block_bytes, block_bytes), dtype=np.uint8)
    for offset, value in _HAND_BUILT[qtype].items():
        raw[:, offset : offset + 2] = np.array([value], dtype=np.float16).view(np.uint8)
    return raw.reshape(byte_shape)


def encode_weight(w: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Float32 (out, in) -> the array to hand to add_tensor for ``qtype``."""
    if qtype == "F32":
        return w.astype(np.float32)
    if qtype == "F16":
        return w.astype(np.float16)
    if qtype in _HAND_BUILT:
        return random_blocks(qtype, w.shape, rng)
    return quantize(w, QT[qtype])  # BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4


def to_float(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """What a correct loader must produce for a stored tensor: float32 in (out, in) layout."""
    return np.array(dequantize(raw, qtype), dtype=np.float32)


def _stored_type(raw: np.ndarray, raw_dtype: QT | None) -> QT:
    if raw_dtype is not None:
        return raw_dtype
    return {np.dtype(np.float32): QT.F32, np.dtype(np.float16): QT.F16}[raw.dtype]


# ---- tiny models per architecture ---------------------------------------------------------

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "smollm3", "granite", "olmo2", "mistral3", "phi3", "gemma2")
MT = gguf.MODEL_TENSOR

# What differs per architecture, on top of the llama layout (all use RMSNorm, RoPE, GQA and
# a gated FFN; the tokenizer is the same tiny byte-level BPE for all four):
#   qwen2:  F32 biases on Q, K and V (blk.N.attn_{q,k,v}.bias); NEOX RoPE in llama.cpp.
#   qwen3:  per-head RMSNorm of q and k before RoPE (blk.N.attn_{q,k}_norm.weight, (head_dim,)),
#           head_dim from attention.key_length/value_length, not dim/n_heads.
#   gemma3: embeddings scaled by sqrt(dim) in the graph, four norms per layer (attn_norm,
#           post_attention_norm, ffn_norm, post_ffw_norm) plus attn_{q,k}_norm, GELU-tanh gate,
#           attention.key_length/value_length, attention.sliding_window (5 of every 6 layers
#           are local: layer i is local unless i % 6 == 5), rope.freq_base for the global layers.
#   smollm3, granite, mistral3: llama's tensors (smollm3: 4 layers, so that layer 3 goes unrotated;
#           granite: its four multipliers in _ARCH_KEYS).
#   olmo2:  no attn_norm/ffn_norm; post_attention_norm and post_ffw_norm, attn_q_norm over the whole q
#           (n_heads * head_dim) and attn_k_norm over the whole k; output.weight of its own; a
#           ``sliding_window`` given writes attention.sliding_window (OLMo 3).
#   phi3:   fused attn_qkv (q | k | v rows) and ffn_up of 2 * ffn_dim rows (gate | up), no ffn_gate; output.weight
#           of its own; attention.sliding_window 0 (Phi-4's converter value; llama.cpp ignores it). Longrope's
#           rope_factors_{long,short} and a partial rope.dimension_count come as tensor_overrides / metadata.
#   gemma2: gemma3's four norms without q/k norms, attention.key_length/value_length, attention.sliding_window
#           (``sliding_window``, default 8: even layers slide), attn_logit_softcapping 50 and
#           final_logit_softcapping 30 as its converter writes them; the head always tied.
# Defaults: (n_layers, n_heads, n_kv_heads, head_dim factor, tie_embeddings, rope_theta, rms_eps).
# head_dim = factor * dim // n_heads (factor 2 where the architecture reads key_length).
_ARCH_DEFAULTS = {
    "llama": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=True, rope_theta=10000.0, rms_eps=1e-5
    ),
    "qwen2": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=False, rope_theta=1000000.0, rms_eps=1e-6
    ),
    "qwen3": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=2, tie_embeddings=True, rope_theta=1000000.0, rms_eps=1e-6
    ),
    "gemma3": dict(
        n_layers=7, n_heads=4, n_kv_heads=1, head_factor=2, tie_embeddings=True, rope_theta=1000000.0, rms_eps=1e-6
    ),
    "smollm3": dict(
        n_layers=4, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=True, rope_theta=10000.0, rms_eps=1e-6
    ),
    "granite": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=True, rope_theta=10000.0, rms_eps=1e-5
    ),
    "olmo2": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=False, rope_theta=10000.0, rms_eps=1e-6
    ),
    "mistral3": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=False, rope_theta=10000.0, rms_eps=1e-5
    ),
    "phi3": dict(
        n_layers=2, n_heads=4, n_kv_heads=2, head_factor=1, tie_embeddings=False, rope_theta=10000.0, rms_eps=1e-5
    ),
    "gemma2": dict(
        n_layers=4, n_heads=4, n_kv_heads=2, head_factor=2, tie_embeddings=True, rope_theta=10000.0, rms_eps=1e-6
    ),
}
GEMMA3_SLIDING_WINDOW = 8
# Keys an architecture's files always carry beyond the common ones (written as GGUFWriter types them).
_ARCH_KEYS = {
    # Granite 3.x has logit 8, residual 0.22, embedding 12, attention 1/64 or 1/128: trained weights balance
    # those; these, each far from 1, keep a random file's blocks weighing on the logits.
    "granite": lambda w: (
        w.add_logit_scale(2.0),
        w.add_residual_scale(0.5),
        w.add_embedding_scale(2.0),
        w.add_attention_scale(0.0625),
    ),
    "phi3": lambda w: w.add_sliding_window(0),  # what the converter writes for Phi-4 (a Phi-3 mini: 2047)
    "gemma2": lambda w: (w.add_attn_logit_softcapping(50.0), w.add_final_logit_softcapping(30.0)),
}


def tensor_name(kind: gguf.MODEL_TENSOR, bid: int | None = None, suffix: str = "weight") -> str:
    """gguf-py's name for a tensor kind, e.g. (MT.ATTN_Q, 0, "bias") -> "blk.0.attn_q.bias"."""
    base = gguf.TENSOR_NAMES[kind]
    return f"{base.format(bid=bid) if bid is not None else base}.{suffix}"


def _layer_shapes(
    arch: str, i: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn_dim: int
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> logical (out, in) shape for one block, in file order."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    t = lambda kind, suffix="weight": tensor_name(kind, i, suffix)  # noqa: E731
    if arch == "olmo2":
        return {
            t(MT.ATTN_Q): (q, dim),
            t(MT.ATTN_K): (kv, dim),
            t(MT.ATTN_V): (kv, dim),
            t(MT.ATTN_OUT): (dim, q),
            t(MT.ATTN_Q_NORM): (q,),
            t(MT.ATTN_K_NORM): (kv,),
            t(MT.ATTN_POST_NORM): (dim,),
            t(MT.FFN_GATE): (ffn_dim, dim),
            t(MT.FFN_UP): (ffn_dim, dim),
            t(MT.FFN_DOWN): (dim, ffn_dim),
            t(MT.FFN_POST_NORM): (dim,),
        }
    if arch == "phi3":
        return {
            t(MT.ATTN_NORM): (dim,),
            t(MT.ATTN_QKV): (q + 2 * kv, dim),
            t(MT.ATTN_OUT): (dim, q),
            t(MT.FFN_NORM): (dim,),
            t(MT.FFN_UP): (2 * ffn_dim, dim),
            t(MT.FFN_DOWN): (dim, ffn_dim),
        }
    shapes = {t(MT.ATTN_NORM): (dim,), t(MT.ATTN_Q): (q, dim)}
    if arch == "qwen2":
        shapes[t(MT.ATTN_Q, "bias")] = (q,)
    if arch in ("qwen3", "gemma3"):
        shapes[t(MT.ATTN_Q_NORM)] = (head_dim,)
    shapes[t(MT.ATTN_K)] = (kv, dim)
    if arch == "qwen2":
        shapes[t(MT.ATTN_K, "bias")] = (kv,)
    if arch in ("qwen3", "gemma3"):
        shapes[t(MT.ATTN_K_NORM)] = (head_dim,)
    shapes[t(MT.ATTN_V)] = (kv, dim)
    if arch == "qwen2":
        shapes[t(MT.ATTN_V, "bias")] = (kv,)
    shapes[t(MT.ATTN_OUT)] = (dim, q)
    if arch in ("gemma3", "gemma2"):
        shapes[t(MT.ATTN_POST_NORM)] = (dim,)
        shapes[t(MT.FFN_PRE_NORM)] = (dim,)  # the same name as FFN_NORM: blk.N.ffn_norm
    else:
        shapes[t(MT.FFN_NORM)] = (dim,)
    shapes.update({t(MT.FFN_GATE): (ffn_dim, dim), t(MT.FFN_UP): (ffn_dim, dim), t(MT.FFN_DOWN): (dim, ffn_dim)})
    if arch in ("gemma3", "gemma2"):
        shapes[t(MT.FFN_POST_NORM)] = (dim,)
    return shapes


def write_tiny_model(
    path,
    *,
    arch="llama",
    tensor_type="F32",
    n_layers=None,
    dim=None,
    n_heads=None,
    n_kv_heads=None,
    head_dim=None,
    ffn_dim=None,
    context_length=128,
    tie_embeddings=None,
    seed=0,
    rope_theta=None,
    rms_eps=None,
    sliding_window=None,
    weight_scale=0.05,
    arch_name=None,
    drop_keys=(),
    tensor_overrides=None,
    metadata=None,
    drop_tensors=(),
) -> dict:
    """Write a tiny random GGUF of one of ``ARCHITECTURES``; weight matrices use ``tensor_type``,
    norm weights and biases stay F32.

    Every argument left None takes the architecture's default (``_ARCH_DEFAULTS``): ``dim``/``ffn_dim``
    64/128, or 256/512 for K-quants (rows must be multiples of 256); ``head_dim`` dim/n_heads for
    llama and qwen2, 2*dim/n_heads for qwen3 and gemma3 (written as attention.key_length and
    value_length, as the real models do); gemma3 has 7 layers (local 0-4 and 6, global 5) and
    ``sliding_window`` 8. ``arch_name`` writes the layout of ``arch`` under another
    general.architecture (and key prefix). Weight matrices are ``weight_scale`` * N(0, 1) before
    quantization (K-quants: random blocks), biases 0.5 N(0, 1), norm weights 1 + 0.05 N(0, 1): for
    gemma3 that is the stored value, which llama.cpp multiplies by as is (its converter added the 1).
    ``drop_keys``/``metadata``/``tensor_overrides``/``drop_tensors`` as in ``write_tiny_llama``.
    The same arguments give byte-identical files (no timestamps; seeded). Returns the config plus
    ``tensors``: name -> float32 array (out, in) dequantized from exactly the bytes written.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    if tensor_type not in SUPPORTED_TYPES:
        raise ValueError(f"tensor_type must be one of {SUPPORTED_TYPES}, got {tensor_type!r}")
    d = _ARCH_DEFAULTS[arch]
    n_layers = d["n_layers"] if n_layers is None else n_layers
    n_heads = d["n_heads"] if n_heads is None else n_heads
    n_kv_heads = d["n_kv_heads"] if n_kv_heads is None else n_kv_heads
    tie_embeddings = d["tie_embeddings"] if tie_embeddings is None else tie_embeddings
    rope_theta = d["rope_theta"] if rope_theta is None else rope_theta
    rms_eps = d["rms_eps"] if rms_eps is None else rms_eps
    if arch in ("gemma3", "gemma2"):
        sliding_window = GEMMA3_SLIDING_WINDOW if sliding_window is None else sliding_window
    elif sliding_window is not None and arch != "olmo2":
        raise ValueError(f"sliding_window is a gemma3, gemma2 or olmo2 setting, not {arch}'s")
    arch_name = arch if arch_name is None else arch_name
    big = tensor_type in K_QUANTS
    dim = dim if dim is not None else (256 if big else 64)
    ffn_dim = ffn_dim if ffn_dim is not None else (512 if big else 128)
    head_dim = head_dim if head_dim is not None else d["head_factor"] * dim // n_heads
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocab()
    vocab = len(tokens)

    shapes = {tensor_name(MT.TOKEN_EMBD): (vocab, dim)}
    for i in range(n_layers):
        shapes.update(_layer_shapes(arch, i, dim, n_heads, n_kv_heads, head_dim, ffn_dim))
    shapes[tensor_name(MT.OUTPUT_NORM)] = (dim,)
    if not tie_embeddings:
        shapes[tensor_name(MT.OUTPUT)] = (vocab, dim)

    stored: dict[str, tuple[np.ndarray, QT | None]] = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):  # F32, large enough to matter
            stored[name] = ((0.5 * rng.standard_normal(shape)).astype(np.float32), None)
        elif len(shape) == 1:  # norm: F32 around 1
            stored[name] = ((1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32), None)
        else:
            w = (weight_scale * rng.standard_normal(shape)).astype(np.float32)
            raw = encode_weight(w, tensor_type, rng)
            stored[name] = (raw, QT[tensor_type] if raw.dtype == np.uint8 else None)
    for name, value in (tensor_overrides or {}).items():
        stored[name] = (value[0], QT[value[1]]) if isinstance(value, tuple) else (value, None)
    for name in drop_tensors:
        del stored[name]  # KeyError on a typo, on purpose

    w = gguf.GGUFWriter(str(path), arch_name)
    # not "phi3" in a phi3 file's name: llama.cpp's vocabulary then looks up Phi-3's "</s>", which this one lacks
    w.add_name(f"tiny-{arch}-test" if arch != "phi3" else "tiny-phi-test")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "gemma3", "gemma2"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("gemma3", "gemma2") or (arch == "olmo2" and sliding_window is not None):
        w.add_sliding_window(sliding_window)
    if arch in _ARCH_KEYS:
        _ARCH_KEYS[arch](w)
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
    for key in drop_keys:
        del w.kv_data[0][key]  # KeyError on a typo, on purpose
    for key, value in (metadata or {}).items():
        old = w.kv_data[0].get(key)
        if isinstance(value, gguf.GGUFValue):  # a value with the type llama.cpp expects (UINT32, ...)
            w.kv_data[0][key] = value
            continue
        w.kv_data[0][key] = gguf.GGUFValue(value, old.type if old else gguf.GGUFValueType.get_type(value))
    for name, (raw, raw_dtype) in stored.items():
        w.add_tensor(name, raw, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tensors = {}
    for name, (raw, raw_dtype) in stored.items():
        try:
            tensors[name] = to_float(raw, _stored_type(raw, raw_dtype))
        except NotImplementedError:  # an override of a type gguf-py cannot dequantize
            tensors[name] = None
    return dict(
        path=Path(path),
        arch=arch_name,
        layout=arch,
        tensor_type=tensor_type,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn_dim=ffn_dim,
        context_length=context_length,
        tie_embeddings=tie_embeddings,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        sliding_window=sliding_window,
        vocab_size=vocab,
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        bos_token_id=1,
        eos_token_id=2,
        chat_template=CHAT_TEMPLATE,
        tensor_types={n: _stored_type(r, t).name for n, (r, t) in stored.items()},
        tensors=tensors,
    )


def write_tiny_llama(
    path,
    *,
    tensor_type="F32",
    n_layers=2,
    dim=None,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=None,
    context_length=128,
    tie_embeddings=True,
    seed=0,
    rope_theta=10000.0,
    rms_eps=1e-5,
    arch="llama",
    drop_keys=(),
    tensor_overrides=None,
    metadata=None,
    drop_tensors=(),
) -> dict:
    """Write a tiny llama GGUF (``write_tiny_model(arch="llama")``); ``arch`` here is only the
    general.architecture written (and its key prefix): the layout stays llama's.

    ``dim``/``ffn_dim`` default to 64/128, or 256/512 for K-quants (rows must be multiples
    of 256). ``drop_keys`` removes metadata keys after they are set; ``metadata`` sets keys
    (an existing key keeps its stored type; a new one gets gguf-py's type for the value).
    ``tensor_overrides`` maps a tensor name to an array written as is (float32 -> F32,
    float16 -> F16) or to a ``(raw_uint8_blocks, "Q2_K")`` pair; ``drop_tensors`` leaves
    tensors out. Returns the config plus ``tensors``: name -> float32 array (out, in)
    dequantized from exactly the bytes written.
    """
    return write_tiny_model(
        path,
        arch="llama",
        arch_name=arch,
        tensor_type=tensor_type,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        ffn_dim=ffn_dim,
        context_length=context_length,
        tie_embeddings=tie_embeddings,
        seed=seed,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        drop_keys=drop_keys,
        tensor_overrides=tensor_overrides,
        metadata=metadata,
        drop_tensors=drop_tensors,
    )
