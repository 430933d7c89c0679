"""Read a GGUF file: its metadata and memory-mapped views of its tensors.

gguf-py's GGUFReader builds a numpy view for every element of every metadata
array, which takes ~4 s on the default model's 49k-token vocabulary. This
reader parses the same format with `struct` over one memory map (~0.1 s) and
uses gguf-py's constants for the tensor types and their block sizes.

Opening a file also checks its layout, before any tensor is used: every
tensor's byte size follows from its type and shape, offsets are aligned,
tensors follow one another without overlaps or gaps (as llama.cpp requires),
and the last one ends inside the file. A wrong type id or shape in a tensor
header is caught here instead of producing garbage weights.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys

from miro.core.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# The fewest header bytes a tensor info (name length, n_dims, type, offset) and a metadata entry
# (key length, value type, smallest value) take: counts the file cannot hold are refused up front.
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
MIN_METADATA_ENTRY_BYTES = 8 + 4 + 1

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (rows, cols): the reverse of ggml's ne
    type: GGMLQuantizationType
    data: np.ndarray  # raw uint8 bytes, a view into the memory map


@dataclass(frozen=True)
class _TensorHeader:
    """A tensor as its header entry describes it, before its bytes are looked at."""

    name: str
    ne: list[int]  # ggml order: ne[0] is the row length
    type: GGMLQuantizationType
    offset: int  # from the start of the data section
    n_bytes: int  # what its type and shape take

    @property
    def end(self) -> int:
        return self.offset + self.n_bytes

    def describe(self) -> str:
        return f"tensor '{self.name}' ({self.type.name}, shape {tuple(reversed(self.ne))}, {self.n_bytes:,} bytes)"


class _Cursor:
    """Sequential little-endian reads over a buffer, with a clear error at its end."""

    def __init__(self, buf, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelFileError(f"{self.path}: the file is truncated (its header ends early).")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("<Q")
        end = self.pos + length
        if end > len(self.buf):
            raise ModelFileError(f"{self.path}: the file is truncated (its header ends early).")
        raw = bytes(self.buf[self.pos : end])
        self.pos = end
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if item_type in _SCALAR_FORMATS:
                return self._scalar_array(item_type, count)
            if self.pos + count * 8 > len(self.buf):  # each string or array item takes 8 bytes or more
                raise ModelFileError(f"{self.path}: the file is truncated (its header ends early).")
            return [self.value(item_type) for _ in range(count)]
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])
        raise ModelFileError(f"{self.path}: unknown metadata value type {vtype}.")

    def _scalar_array(self, item_type: int, count: int) -> list:
        dtype = np.dtype(_SCALAR_FORMATS[item_type])
        end = self.pos + count * dtype.itemsize
        if end > len(self.buf):
            raise ModelFileError(f"{self.path}: the file is truncated (its header ends early).")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos = end
        return values.tolist()


class GGUFFile:
    """An open GGUF file: `metadata` (key -> python value) and `tensors` (name -> TensorInfo)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise ModelFileError(f"{self.path}: no such model file.") from None
        except IsADirectoryError:
            raise ModelFileError(f"{self.path}: is a directory, not a GGUF file.") from None
        except ValueError:  # mmap of an empty file
            raise ModelFileError(f"{self.path}: is not a GGUF file (it is empty).") from None
        self.metadata: dict[str, object] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _parse(self) -> None:
        buf = self._map
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: is not a GGUF file (bad magic bytes).")
        cur = _Cursor(buf, self.path)
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise ModelFileError(f"{self.path}: GGUF version {version} is not supported (2 or 3 are).")
        n_tensors, n_kv = cur.unpack("<QQ")
        if n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_METADATA_ENTRY_BYTES > len(buf):
            raise ModelFileError(
                f"{self.path}: the file is truncated (its header claims {n_tensors:,} tensors and {n_kv:,} "
                f"metadata keys, more than {len(buf):,} bytes can hold)."
            )
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.unpack("<I"))

        headers = [self._read_tensor_header(cur) for _ in range(n_tensors)]
        alignment = self._alignment()
        data_start = -(-cur.pos // alignment) * alignment
        self._check_layout(headers, alignment, data_start)
        # every metadata value is a Python object now: the pages they were read from can leave (6 MiB of Gemma 3's
        # 262,144-token vocabulary)
        if hasattr(buf, "madvise") and data_start >= mmap.PAGESIZE:
            buf.madvise(mmap.MADV_DONTNEED, 0, data_start // mmap.PAGESIZE * mmap.PAGESIZE)
        for h in headers:
            data = np.frombuffer(buf, dtype=np.uint8, count=h.n_bytes, offset=data_start + h.offset)
            self.tensors[h.name] = TensorInfo(name=h.name, shape=tuple(reversed(h.ne)), type=h.type, data=data)

    def _read_tensor_header(self, cur: _Cursor) -> _TensorHeader:
        name = cur.string()
        n_dims = cur.unpack("<I")
        if n_dims > MAX_DIMS:
            raise ModelFileError(f"{self.path}: tensor '{name}' claims {n_dims} dimensions (ggml allows {MAX_DIMS}).")
        ne = [cur.unpack("<Q") for _ in range(n_dims)]
        type_id = cur.unpack("<I")
        offset = cur.unpack("<Q")
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise ModelFileError(f"{self.path}: tensor {name} has unknown type id {type_id}.") from None
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        row_length = ne[0] if ne else 1
        if row_length % block_elems:
            raise ModelFileError(
                f"{self.path}: tensor {name} has rows of {row_length} elements, not a whole number of "
                f"{qtype.name} blocks ({block_elems} elements each)."
            )
        return _TensorHeader(name, ne, qtype, offset, prod(ne) // block_elems * block_bytes)

    def _alignment(self) -> int:
        alignment = self.metadata.get(Keys.General.ALIGNMENT, DEFAULT_ALIGNMENT)
        is_power_of_two = type(alignment) is int and alignment > 0 and alignment & (alignment - 1) == 0
        if not is_power_of_two:
            raise ModelFileError(f"{self.path}: {Keys.General.ALIGNMENT} is {alignment!r}, not a power of two.")
        return alignment

    def _check_layout(self, headers: list[_TensorHeader], alignment: int, data_start: int) -> None:
        """Tensors, in offset order, must tile the data section: each starts where the previous one ends
        (rounded up to the alignment) and the last ends inside the file. A wrong type or shape in one
        header shows up here as an overlap or a gap next to that tensor."""
        names = set()
        for h in headers:
            if h.name in names:
                raise ModelFileError(f"{self.path}: tensor '{h.name}' is listed twice.")
            names.add(h.name)
            if h.offset % alignment:
                raise ModelFileError(
                    f"{self.path}: tensor '{h.name}' starts at data offset {h.offset:,}, "
                    f"not a multiple of {Keys.General.ALIGNMENT} ({alignment})."
                )
        expected_start, previous = 0, None
        for h in sorted(headers, key=lambda h: h.offset):
            if h.offset != expected_start:
                if previous is None:
                    problem = f"the first tensor, '{h.name}', starts at data offset {h.offset:,} instead of 0"
                elif h.offset < previous.end:
                    problem = (
                        f"{previous.describe()} overlaps the next tensor, '{h.name}', "
                        f"which starts {h.offset - previous.offset:,} bytes after it"
                    )
                else:
                    problem = (
                        f"{previous.describe()} is followed by {h.offset - previous.end:,} unused bytes "
                        f"before the next tensor, '{h.name}'"
                    )
                raise ModelFileError(f"{self.path}: {problem}; a tensor's type or shape in the header is wrong.")
            if data_start + h.end > len(self._map):
                raise ModelFileError(
                    f"{self.path}: the file is truncated (tensor {h.name} needs bytes up to {data_start + h.end:,}, "
                    f"the file has {len(self._map):,})."
                )
            expected_start, previous = -(-h.end // alignment) * alignment, h

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: metadata key '{key}' is missing.")
        return self.metadata[key]


def release_pages(view: np.ndarray) -> None:
    """Drop the whole memory pages under `view`, a slice of a GGUF file's memory map, from this process's
    resident memory: the page cache keeps them, and a later read maps them back in. For tensors repacked at
    load, whose file bytes nothing reads afterwards, and for an embedding's rows once a step has read them. An array
    that is no view of a memory map is left alone."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (isinstance(root.base, memoryview) and isinstance(root.base.obj, mmap.mmap)):
        return
    file_map = root.base.obj
    map_start = np.frombuffer(file_map, np.uint8, count=1).__array_interface__["data"][0]
    start = view.__array_interface__["data"][0] - map_start
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first and hasattr(file_map, "madvise"):
        file_map.madvise(mmap.MADV_DONTNEED, first, end - first)
