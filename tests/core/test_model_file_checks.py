"""A GGUF file that lies about itself ends in one sentence naming the file and the field or tensor,
before any large allocation: tiny files written wrong on purpose, and byte-patched copies of the real model."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from broken_gguf import patched_copy
from gguf_factory import encode_weight, tiny_vocab, write_tiny_llama

from miro.core import Engine, ModelFileError
from miro.core.loading.model_config import MAX_CONTEXT_LENGTH
from miro.core.layers.rope import ROPE_CHUNK

MIRO = Path(sys.executable).parent / "miro"
FLIPPED_CONTEXT = 8192 | 1 << 28  # llama.context_length of the default model with bit 28 flipped
MiB = 1 << 20
REFUSED_PEAK_RSS = 512 * MiB  # a refused file never gets to the weights (the loaded default model is ~2 GiB)


# A small Python process runs the command and reports its peak RSS: measured from pytest itself, a child's
# ru_maxrss would start at pytest's own peak (Linux carries the high-water mark over fork and exec).
_MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.stdout.buffer.write(done.stderr)
"""


def run_measured(*args) -> tuple[int, str, int]:
    """Run a command; return its exit code, its stderr and its peak RSS in bytes."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *map(str, args)], capture_output=True, timeout=300)
    first_line, _, stderr = out.stdout.decode().partition("\n")
    code, peak_kib = map(int, first_line.split())
    return code, stderr, peak_kib * 1024


def miro_generate(model: Path) -> tuple[int, str, int]:
    return run_measured(MIRO, "generate", "--model", model, "--max-tokens", "1", "hi")


def assert_one_sentence(message: str, path: Path, *fragments: str) -> None:
    assert message.startswith(f"{path}: ") and message.endswith(".") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


# ---- the real default model, patched in place ------------------------------------------------

PATCHES = {
    "q4_1_claims_q8_0": (
        dict(tensor_types={"blk.0.ffn_up.weight": "Q8_0"}),
        ["tensor 'blk.0.ffn_up.weight' (Q8_0, shape (1536, 576), 940,032 bytes) overlaps the next tensor"],
    ),
    "q8_0_claims_q4_1": (  # smaller than it is: a gap instead of an overlap
        dict(tensor_types={"token_embd.weight": "Q4_1"}),
        ["tensor 'token_embd.weight' (Q4_1", "unused bytes before the next tensor, 'blk.0.attn_norm.weight'"],
    ),
    "overlapping_tensors": (
        dict(offset_shifts={"blk.0.ffn_norm.weight": -32}),
        ["tensor 'blk.0.ffn_up.weight'", "overlaps the next tensor, 'blk.0.ffn_norm.weight'"],
    ),
    "misaligned_offset": (
        dict(offset_shifts={"blk.3.attn_q.weight": 4}),
        ["tensor 'blk.3.attn_q.weight' starts at data offset", "not a multiple of general.alignment (32)"],
    ),
    "truncated": (dict(size=60_000_000), ["the file is truncated (tensor blk."]),
    "flipped_context_length": (
        dict(metadata={"llama.context_length": FLIPPED_CONTEXT}),
        [f"llama.context_length is {FLIPPED_CONTEXT:,} tokens, more than the {MAX_CONTEXT_LENGTH:,} miro accepts"],
    ),
    "block_count_too_large": (
        dict(metadata={"llama.block_count": 31}),
        ["llama.block_count is 31, but the file has blk.N tensors for 30 blocks"],
    ),
    "block_count_huge": (
        dict(metadata={"llama.block_count": 2**31}),
        ["llama.block_count is 2,147,483,648, but the file has blk.N tensors for 30 blocks"],
    ),
    "heads_do_not_divide": (
        dict(metadata={"llama.attention.head_count": 7}),
        ["llama.attention.head_count is 7, which does not divide llama.embedding_length (576)"],
    ),
    "embedding_length_zero": (
        dict(metadata={"llama.embedding_length": 0}),
        ["metadata key 'llama.embedding_length' is 0, not a positive integer"],
    ),
    "feed_forward_length_lies": (
        dict(metadata={"llama.feed_forward_length": 1024}),
        ["tensor 'blk.0.ffn_gate.weight' has shape (1536, 576), expected (1024, 576)"],
    ),
    "vocab_size_lies": (
        dict(metadata={"llama.vocab_size": 49153}),
        ["llama.vocab_size is 49153, but 'tokenizer.ggml.tokens' has 49,152 tokens"],
    ),
    "bos_outside_vocabulary": (
        dict(metadata={"tokenizer.ggml.bos_token_id": 49152}),
        ["tokenizer.ggml.bos_token_id is 49152, outside the vocabulary of 49,152 tokens"],
    ),
}


@pytest.mark.parametrize("name", PATCHES)
def test_patched_default_model_is_one_sentence_from_the_cli(tmp_path, smollm2_path, name):
    """The real `miro generate` in a subprocess: exit 1, one line on stderr, no traceback, a small peak RSS."""
    patch, fragments = PATCHES[name]
    path = patched_copy(smollm2_path, tmp_path / "patched.gguf", **patch)
    code, stderr, peak_rss = miro_generate(path)
    assert code == 1, stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1 and stderr.startswith("Error: "), stderr
    assert_one_sentence(stderr.removeprefix("Error: ").rstrip("\n"), path, *fragments)
    assert peak_rss < REFUSED_PEAK_RSS, f"peak RSS {peak_rss / MiB:.0f} MiB"


def test_patched_default_model_raises_model_file_error(tmp_path, smollm2_path):
    path = patched_copy(smollm2_path, tmp_path / "q8.gguf", tensor_types={"blk.0.ffn_up.weight": "Q8_0"})
    with pytest.raises(ModelFileError) as err:
        Engine.from_model(path)
    assert_one_sentence(str(err.value), path, "blk.0.ffn_up.weight")


def test_long_context_under_the_bound_costs_no_memory(tmp_path, smollm2_path):
    """A context length miro accepts (2M tokens) allocates nothing per declared position."""
    long_context = 8192 | 1 << 21
    assert long_context <= MAX_CONTEXT_LENGTH
    path = patched_copy(smollm2_path, tmp_path / "long.gguf", metadata={"llama.context_length": long_context})
    code, stderr, peak_long = miro_generate(path)
    assert code == 0, stderr
    code, stderr, peak_normal = miro_generate(smollm2_path)
    assert code == 0, stderr
    # RoPE tables for 2M positions would add ~770 MiB (angles, cos and sin in float32)
    assert peak_long < peak_normal + 64 * MiB, (peak_long / MiB, peak_normal / MiB)


def test_rope_tables_grow_with_the_positions_used(tmp_path):
    info = write_tiny_llama(tmp_path / "tiny.gguf", context_length=MAX_CONTEXT_LENGTH)
    engine = Engine.from_model(info["path"], num_kv_blocks=8)
    assert len(engine.model.rope.cos) == 0
    engine.logits([5, 6, 7])
    assert len(engine.model.rope.cos) == len(engine.model.rope.sin) == ROPE_CHUNK


# ---- tiny files written wrong on purpose -----------------------------------------------------

VOCAB = len(tiny_vocab()[0])  # 272


def _quantized_norm(dim=64):
    return encode_weight(np.ones(dim, dtype=np.float32), "Q8_0", np.random.default_rng(0)), "Q8_0"


TINY_FILES = {
    "missing_tensor": (dict(drop_tensors=("blk.1.ffn_up.weight",)), ["tensor 'blk.1.ffn_up.weight' is missing"]),
    "missing_layer": (
        dict(
            n_layers=3,
            drop_tensors=tuple(
                f"blk.1.{t}.weight"
                for t in (
                    "attn_norm",
                    "attn_q",
                    "attn_k",
                    "attn_v",
                    "attn_output",
                    "ffn_norm",
                    "ffn_gate",
                    "ffn_up",
                    "ffn_down",
                )
            ),
        ),
        ["tensor 'blk.1.attn_norm.weight' is missing"],
    ),
    "wrong_shape": (
        dict(tensor_overrides={"blk.1.attn_k.weight": np.zeros((16, 64), dtype=np.float32)}),
        ["tensor 'blk.1.attn_k.weight' has shape (16, 64), expected (32, 64)"],
    ),
    "norm_quantized": (
        dict(tensor_overrides={"blk.0.ffn_norm.weight": _quantized_norm()}),
        ["tensor 'blk.0.ffn_norm.weight' is stored as Q8_0, but a norm weight must be one of F32, F16, BF16"],
    ),
    "kv_heads_do_not_divide": (
        dict(metadata={"llama.attention.head_count_kv": 3}),
        ["llama.attention.head_count_kv is 3, which does not divide llama.attention.head_count (4)"],
    ),
    "vocab_disagrees_with_token_embd": (
        dict(tensor_overrides={"token_embd.weight": np.zeros((VOCAB + 1, 64), dtype=np.float32)}),
        [f"tensor 'token_embd.weight' has shape ({VOCAB + 1}, 64), expected ({VOCAB}, 64)"],
    ),
    "untied_head_disagrees": (
        dict(tie_embeddings=False, tensor_overrides={"output.weight": np.zeros((VOCAB - 2, 64), dtype=np.float32)}),
        [f"tensor 'output.weight' has shape ({VOCAB - 2}, 64), expected ({VOCAB}, 64)"],
    ),
    "scores_shorter_than_tokens": (
        dict(metadata={"tokenizer.ggml.scores": [0.0] * (VOCAB - 1)}),
        [f"'tokenizer.ggml.scores' has {VOCAB - 1} entries, but 'tokenizer.ggml.tokens' has {VOCAB}"],
    ),
    "token_types_longer_than_tokens": (
        dict(metadata={"tokenizer.ggml.token_type": [1] * (VOCAB + 5)}),
        [f"'tokenizer.ggml.token_type' has {VOCAB + 5} entries, but 'tokenizer.ggml.tokens' has {VOCAB}"],
    ),
    "eos_outside_vocabulary": (
        dict(metadata={"tokenizer.ggml.eos_token_id": VOCAB}),
        [f"tokenizer.ggml.eos_token_id is {VOCAB}, outside the vocabulary of {VOCAB} tokens"],
    ),
    "rms_eps_zero": (
        dict(rms_eps=0.0),
        ["metadata key 'llama.attention.layer_norm_rms_epsilon' is 0.0, not a positive number"],
    ),
    "alignment_not_power_of_two": (
        dict(metadata={"general.alignment": 24}),
        ["general.alignment is 24, not a power of two"],
    ),
}


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_file_that_lies_is_one_sentence(tmp_path, name):
    options, fragments = TINY_FILES[name]
    path = write_tiny_llama(tmp_path / "bad.gguf", **options)["path"]
    with pytest.raises(ModelFileError) as err:
        Engine.from_model(path)
    assert_one_sentence(str(err.value), path, *fragments)


def test_tiny_file_with_every_check_passing_loads(tmp_path):
    """The checks accept what they should: three layers, an untied head, scores, an explicit alignment."""
    path = write_tiny_llama(
        tmp_path / "ok.gguf",
        n_layers=3,
        tie_embeddings=False,
        metadata={"tokenizer.ggml.scores": [0.0] * VOCAB, "general.alignment": 32},
    )["path"]
    engine = Engine.from_model(path, num_kv_blocks=8)
    assert engine.config.n_layers == 3 and engine.config.vocab_size == VOCAB
