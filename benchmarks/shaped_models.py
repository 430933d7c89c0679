"""Random-weight GGUF files in real models' layouts, for the benchmarks: TinyLlama-1.1B, Llama-3.2-1B and 3B,
Qwen2.5-1.5B (the shapes tinyllama.py's --shape names; see its docstring for each).

    write_model(path, shape, "Q4_0" | "F16")         every matrix random Q4_0 blocks or F16 values, norms 1
    model_file(shape, quant, folder, llama_python, threads)
        Q4_0 written into folder; Q4_K_M or Q8_0 written as F16 and quantized by llama.cpp's own
        llama_model_quantize under llama_python (QUANTIZE_SCRIPT), kept in CACHE for later runs

The vocabulary is the tests' byte-level BPE padded to the shape's size (prompts are token ids).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "tinyllama": dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632, vocab=32000),
    "llama3.2-1b": dict(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab=128256,
        tied=1,
        rope_theta=500000,
        rope_freqs=32,
    ),
    "llama3.2-3b": dict(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab=128256,
        tied=1,
        rope_theta=500000,
        rope_freqs=32,
    ),
    "qwen2.5-1.5b": dict(
        dim=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        ffn_dim=8960,
        vocab=151936,
        tied=1,
        rope_theta=1000000,
        arch="qwen2",
        rms_eps=1e-6,
        qkv_bias=1,
    ),
}
CONTEXT = 2048


Q4_0_SCALE = 0.004  # the random Q4_0 blocks' float16 scale: values (nibble - 8) x scale, in about +-0.03
CACHE = Path.home() / ".cache" / "miro" / "bench"  # llama.cpp's quantized files, one per shape, seed and quant
LLAMA_FTYPES = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}  # made by its quantizer


def layout(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and shape, in file order: matrices (rows, cols), vectors (norms, biases, rope_freqs)."""
    s = SHAPES[shape]
    dim, kv_dim = s["dim"], s["dim"] // s["n_heads"] * s["n_kv_heads"]
    tensors = [("token_embd.weight", (s["vocab"], dim))]
    if s.get("rope_freqs"):
        tensors.append(("rope_freqs.weight", (s["dim"] // s["n_heads"] // 2,)))
    for i in range(s["n_layers"]):
        b = f"blk.{i}"
        tensors += [(f"{b}.attn_norm.weight", (dim,))]
        for proj, rows in (("q", dim), ("k", kv_dim), ("v", kv_dim)):
            tensors.append((f"{b}.attn_{proj}.weight", (rows, dim)))
            if s.get("qkv_bias"):
                tensors.append((f"{b}.attn_{proj}.bias", (rows,)))
        tensors += [
            (f"{b}.attn_output.weight", (dim, dim)),
            (f"{b}.ffn_norm.weight", (dim,)),
            (f"{b}.ffn_gate.weight", (s["ffn_dim"], dim)),
            (f"{b}.ffn_up.weight", (s["ffn_dim"], dim)),
            (f"{b}.ffn_down.weight", (dim, s["ffn_dim"])),
        ]
    tensors.append(("output_norm.weight", (dim,)))
    return tensors if s.get("tied") else tensors + [("output.weight", (s["vocab"], dim))]


def llama3_rope_freqs(head_dim: int, theta: float, factor: float, low=1.0, high=4.0, original=8192) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for a Llama 3.x config (rope_type llama3)."""
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def random_q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_0 blocks with scale Q4_0_SCALE, as (rows, bytes of a row) uint8."""
    blocks = rng.integers(0, 256, size=(rows * cols // 32, 18), dtype=np.uint8)
    blocks[:, :2] = np.array([Q4_0_SCALE], dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, cols // 32 * 18)


def random_f16(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Uniform in the Q4_0 blocks' range +-8 x Q4_0_SCALE (the same spread), as (rows, bytes of a row) uint8."""
    half = 8 * Q4_0_SCALE
    values = rng.random((rows, cols), dtype=np.float32) * (2 * half) - half
    return values.astype(np.float16).view(np.uint8)


RANDOM_MATRIX = {"Q4_0": random_q4_0, "F16": random_f16}


def add_byte_vocab(w, vocab: int) -> None:
    """The tests' byte-level BPE vocabulary (which miro and llama.cpp both read) padded to `vocab` tokens, BOS 1,
    EOS 2, no BOS added."""
    import gguf

    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_factory import tiny_vocab

    tokens, types, merges = tiny_vocab()
    tokens += [f"<x{i}>" for i in range(vocab - len(tokens))]
    types += [int(gguf.TokenType.NORMAL)] * (vocab - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def add_metadata(w, shape: str, file_type) -> None:
    """The shape's hyperparameters and a byte-level BPE vocabulary padded to its vocabulary size."""
    import gguf

    s = SHAPES[shape]
    w.add_name(f"{shape}-shaped-random")
    w.add_block_count(s["n_layers"])
    w.add_context_length(CONTEXT)
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(s["ffn_dim"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_freq_base(float(s.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(s.get("rms_eps", 1e-5))
    w.add_vocab_size(s["vocab"])
    w.add_rope_dimension_count(s["dim"] // s["n_heads"])
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_byte_vocab(w, s["vocab"])


def write_model(path: Path, shape: str, weights: str = "Q4_0", seed: int = 0) -> None:
    """A GGUF of the shape, every matrix random `weights` (Q4_0 blocks or F16 values), norms 1, biases N(0, 0.25).

    Tensors are made and written one at a time, so memory holds one matrix (the F16 files are 2.2 to 6.4 GB).
    """
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    qtype = gguf.GGMLQuantizationType[weights]
    file_type = {"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "F16": gguf.LlamaFileType.MOSTLY_F16}[weights]
    s = SHAPES[shape]
    tensors = layout(shape)
    w = gguf.GGUFWriter(str(path), s.get("arch", "llama"))
    add_metadata(w, shape, file_type)
    for name, shape in tensors:
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            byte_shape = quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape in tensors:
        if name == "rope_freqs.weight":
            w.write_tensor_data(llama3_rope_freqs(s["dim"] // s["n_heads"], s["rope_theta"], s["rope_freqs"]))
            continue
        if name.endswith(".bias"):  # large enough to weigh on q and k (Qwen2.5's own are larger still)
            w.write_tensor_data((0.5 * rng.standard_normal(shape)).astype(np.float32))
            continue
        w.write_tensor_data(np.ones(shape, np.float32) if len(shape) == 1 else RANDOM_MATRIX[weights](rng, *shape))
    w.close()


QUANTIZE_SCRIPT = r"""
import ctypes, sys
import llama_cpp as l

src, dst, threads, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
l.llama_backend_init()
params = l.llama_model_quantize_default_params()
params.ftype = getattr(l, ftype)
params.nthread = threads
sys.exit(l.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
"""


def quantized_model(shape: str, quant: str, llama_python: str | None, threads: int, seed: int = 0) -> tuple[Path, str]:
    """llama.cpp's `quant` (a LLAMA_FTYPES key) of the shape's random F16 model: made once per shape, seed and quant, then
    read from CACHE.

    Returns the path and how it came to be (for the report line).
    """
    path = CACHE / f"{shape}-{'-'.join(map(str, SHAPES[shape].values()))}-seed{seed}-{quant.lower()}.gguf"
    if path.exists():
        return path, f"cached in {CACHE}"
    if not llama_python:
        raise SystemExit(f"--quant {quant}: llama.cpp's quantizer runs under --llama-python (once; the file is cached)")
    CACHE.mkdir(parents=True, exist_ok=True)
    f16, partial = path.with_suffix(".f16.tmp"), path.with_suffix(".partial")
    t0 = time.perf_counter()
    try:
        write_model(f16, shape, "F16", seed)
        done = subprocess.run(
            [llama_python, "-c", QUANTIZE_SCRIPT, str(f16), str(partial), str(threads), LLAMA_FTYPES[quant]],
            capture_output=True,
            text=True,
        )
    finally:
        f16.unlink(missing_ok=True)  # 2.2 to 6.4 GB: kept only while the quantizer reads it
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.rename(path)
    return path, f"F16 written and quantized by llama.cpp in {time.perf_counter() - t0:.0f} s, cached in {CACHE}"


def model_file(shape: str, quant: str, folder: Path, llama_python: str | None, threads: int) -> tuple[Path, str]:
    """The shape's model for --quant (Q4_0 written into `folder`, llama.cpp's quants from the cache) and how it came to be."""
    if quant in LLAMA_FTYPES:
        return quantized_model(shape, quant, llama_python, threads)
    path = folder / f"{shape}-q4_0.gguf"
    t0 = time.perf_counter()
    write_model(path, shape)
    return path, f"written in {time.perf_counter() - t0:.0f} s"


def type_mix(path: Path) -> str:
    """How many tensors of each GGML type the file holds, most common first."""
    import gguf

    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return ", ".join(f"{n} {name}" for name, n in counts.most_common())
