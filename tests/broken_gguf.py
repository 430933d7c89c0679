"""GGUF files broken in one known way, for the loader's refusals: the ``write_*`` helpers build on gguf_factory's tiny
llama; ``patched_copy`` copies a real file and overwrites header fields in place."""

from __future__ import annotations

import shutil
import struct
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf_factory import random_blocks, write_tiny_llama


# ---- broken files -------------------------------------------------------------------------


def write_not_gguf(path) -> None:
    """A plain text file."""
    Path(path).write_text("this is not a GGUF file\n")


def _cut(path, source, where) -> None:
    if source is None:
        source = path
        write_tiny_llama(path)
    data = Path(source).read_bytes()
    size = where(gguf.GGUFReader(source), len(data))
    assert 0 < size < len(data)
    Path(path).write_bytes(data[:size])


def write_truncated(path, source=None) -> None:
    """``source`` (a valid GGUF; default: a fresh tiny llama) cut halfway into its tensor data."""
    _cut(path, source, lambda r, n: r.data_offset + (n - r.data_offset) // 2)


def write_truncated_header(path, source=None) -> None:
    """``source`` cut in the middle of its metadata (inside the token list)."""
    _cut(path, source, lambda r, n: int(r.fields["tokenizer.ggml.tokens"].offset) + 100)


def write_unsupported_arch(path) -> None:
    """A well-formed file whose general.architecture is 'mamba' (keys prefixed 'mamba.')."""
    write_tiny_llama(path, arch="mamba")


def write_unsupported_tensor_type(path) -> None:
    """A tiny llama whose blk.0.attn_q.weight is stored as Q2_K (everything else F32)."""
    rng = np.random.default_rng(1)
    write_tiny_llama(
        path,
        dim=256,
        ffn_dim=512,
        n_heads=4,
        n_kv_heads=2,
        tensor_overrides={"blk.0.attn_q.weight": (random_blocks("Q2_K", (256, 256), rng), "Q2_K")},
    )


def write_missing_key(path) -> None:
    """A tiny llama without llama.embedding_length."""
    write_tiny_llama(path, drop_keys=("llama.embedding_length",))


def write_shape_mismatch(path) -> None:
    """A tiny llama (dim 64) whose blk.0.attn_q.weight is (48, 64) instead of (64, 64)."""
    bad = (0.05 * np.random.default_rng(2).standard_normal((48, 64))).astype(np.float32)
    write_tiny_llama(path, tensor_overrides={"blk.0.attn_q.weight": bad})


# ---- byte-patched copies of a real file ---------------------------------------------------

_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT32: "<f",
}


@lru_cache(maxsize=4)
def header_positions(source: str) -> dict:
    """Where a GGUF's header fields sit (found by gguf-py's reader, not miro's parser):
    ``metadata``: key -> (file position of its scalar value, struct format);
    ``tensors``: name -> (file position of its type id, its data offset, of the uint64 that follows)."""
    reader = gguf.GGUFReader(source)
    metadata = {}
    for key, field in reader.fields.items():
        if len(field.types) == 1 and field.types[0] in _SCALAR_FORMATS:
            value_pos = field.offset + sum(part.nbytes for part in field.parts[:-1])
            metadata[key] = (value_pos, _SCALAR_FORMATS[field.types[0]])
    tensors = {}
    for t in reader.tensors:  # parts: name length, name, n_dims, dims, type id, data offset
        type_pos = t.field.offset + sum(part.nbytes for part in t.field.parts[:4])
        tensors[t.name] = (type_pos, type_pos + 4)
    return dict(metadata=metadata, tensors=tensors)


def patched_copy(source, dest, *, metadata=None, tensor_types=None, offset_shifts=None, size=None) -> Path:
    """Copy ``source`` to ``dest`` and overwrite header fields in place (the layout stays the same):
    ``metadata``: scalar key -> new value (in its stored type); ``tensor_types``: tensor name -> type
    name such as "Q8_0"; ``offset_shifts``: tensor name -> bytes added to its data offset;
    ``size``: cut the copy to that many bytes."""
    shutil.copyfile(source, dest)
    where = header_positions(str(source))
    with open(dest, "r+b") as f:
        for key, value in (metadata or {}).items():
            pos, fmt = where["metadata"][key]
            f.seek(pos)
            f.write(struct.pack(fmt, value))
        for name, type_name in (tensor_types or {}).items():
            f.seek(where["tensors"][name][0])
            f.write(struct.pack("<I", QT[type_name]))
        for name, shift in (offset_shifts or {}).items():
            f.seek(where["tensors"][name][1])
            offset = struct.unpack("<Q", f.read(8))[0]
            f.seek(where["tensors"][name][1])
            f.write(struct.pack("<Q", offset + shift))
        if size is not None:
            f.truncate(size)
    return Path(dest)
