"""Read a GGUF file: its metadata and memory-mapped views of its tensors.

gguf-py's GGUFReader builds a numpy view for every element of every metadata
array, which takes ~4 s on the default model's 49k-token vocabulary. This
reader parses the same format with `struct` over one memory map (~0.1 s) and
uses gguf-py's constants for the tensor types and their block sizes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

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
        raw = bytes(self.buf[self.pos:end])
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
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.unpack("<I"))

        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            ne = [cur.unpack("<Q") for _ in range(n_dims)]
            type_id = cur.unpack("<I")
            offset = cur.unpack("<Q")
            infos.append((name, ne, type_id, offset))

        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
        for name, ne, type_id, offset in infos:
            self.tensors[name] = self._tensor(name, ne, type_id, data_start + offset)

    def _tensor(self, name: str, ne: list[int], type_id: int, start: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise ModelFileError(f"{self.path}: tensor {name} has unknown type id {type_id}.") from None
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_elems = int(np.prod(ne)) if ne else 1
        if n_elems % block_elems:
            raise ModelFileError(
                f"{self.path}: tensor {name} has {n_elems} elements, not a whole number of {qtype.name} blocks."
            )
        n_bytes = n_elems // block_elems * block_bytes
        if start + n_bytes > len(self._map):
            raise ModelFileError(
                f"{self.path}: the file is truncated (tensor {name} needs bytes up to {start + n_bytes:,}, "
                f"the file has {len(self._map):,})."
            )
        data = np.frombuffer(self._map, dtype=np.uint8, count=n_bytes, offset=start)
        return TensorInfo(name=name, shape=tuple(reversed(ne)), type=qtype, data=data)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: metadata key '{key}' is missing.")
        return self.metadata[key]
