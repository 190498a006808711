"""A GGUF file's metadata and tensors, read with `struct` and a numpy memmap.

What the references need of gguf's GGUFReader (`fields[key].contents()`, `.tensors` with name,
shape, tensor_type and data), about 10x faster: GGUFReader builds a numpy view per array element,
~15 s for Gemma 3's 262k-token vocabulary on 2 cores, paid by every pytest process. Written from
the GGUF specification (docs/gguf.md in ggml), not from fathom's C++ reader; tensors are still
dequantized by gguf.quants.
"""
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class Field:
    """One metadata value; `data` has one entry per array element (GGUFReader's len() of a field)."""

    def __init__(self, value):
        self.value = value
        self.data = value if isinstance(value, list) else [value]

    def contents(self):
        return self.value


@dataclass
class Tensor:
    name: str
    shape: list           # GGUF order: the row length first
    tensor_type: GGMLQuantizationType
    data: np.ndarray      # the tensor's bytes (uint8), as gguf.quants.dequantize takes them

    @property
    def n_elements(self):
        return int(np.prod(self.shape))


def read_metadata(data, pos=0):
    """(key -> value, position after the key/value pairs, tensor count) of a GGUF file's bytes
    (bytes or an mmap: slices of either are bytes, cheap to make)."""
    def take(n):
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    def string():
        (n,) = struct.unpack("<Q", take(8))
        return take(n).decode("utf-8")

    def value(t):
        if t == _STRING:
            return string()
        if t == _ARRAY:
            (et,) = struct.unpack("<I", take(4))
            (count,) = struct.unpack("<Q", take(8))
            if et == _STRING:
                return [string() for _ in range(count)]
            dt = np.dtype(_NUMPY[et])
            return np.frombuffer(take(dt.itemsize * count), dtype=dt).tolist()
        fmt = _SCALARS[t]
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    assert take(4) == b"GGUF", "not a GGUF file"
    (version,) = struct.unpack("<I", take(4))
    assert version == 3, f"GGUF version {version}"
    n_tensors, n_kv = struct.unpack("<QQ", take(16))
    meta = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack("<I", take(4))
        meta[key] = value(t)
    return meta, pos, n_tensors


class GgufFile:
    """`fields` (key -> Field) and `tensors` (list of Tensor, file order) of a GGUF file."""

    def __init__(self, path):
        self.path = str(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        raw = self._map
        meta, pos, n_tensors = read_metadata(raw)
        self.fields = {k: Field(v) for k, v in meta.items()}
        infos = []
        for _ in range(n_tensors):
            (n,) = struct.unpack_from("<Q", raw, pos)
            name = raw[pos + 8:pos + 8 + n].decode("utf-8")
            pos += 8 + n
            (n_dims,) = struct.unpack_from("<I", raw, pos)
            dims = list(struct.unpack_from(f"<{n_dims}Q", raw, pos + 4))
            pos += 4 + 8 * n_dims
            t, offset = struct.unpack_from("<IQ", raw, pos)
            pos += 12
            infos.append((name, dims, GGMLQuantizationType(t), offset))
        align = int(meta.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        self.tensors = []
        for name, dims, t, offset in infos:
            block, block_bytes = GGML_QUANT_SIZES[t]
            nbytes = int(np.prod(dims)) // block * block_bytes
            data = np.frombuffer(raw, dtype=np.uint8, count=nbytes, offset=start + offset)
            self.tensors.append(Tensor(name, dims, t, data))


def read_gguf_metadata(path):
    """Only the key/value pairs (the first 64 MiB hold them for the default models)."""
    with open(path, "rb") as f:
        return read_metadata(f.read(64 << 20))[0]
