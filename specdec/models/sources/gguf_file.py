"""A GGUF file's metadata and tensor index, read without materialising its big arrays.

gguf-py's GGUFReader builds a Python object (and numpy views) for every element of every metadata array:
for a Qwen2.5 file that is the tokenizer's 151,936 tokens, token types and merges, tens of seconds on a
2-core machine, on every load, for a model whose tokenizer we already hold as tokenizer.json. Loading
needs only the tensor index and a few scalar keys. This reader walks the header once with `struct`
(skipping each array: a numeric array by its size, a string array by its lengths), keeps scalars and
short arrays, and memory-maps the tensor data; a tensor's `data` has the dtype and shape GGUFReader
gives it (float types as themselves, block types as uint8 rows of whole blocks), so gguf-py's own
`gguf.quants.dequantize` reads it unchanged.

Format (GGUF v2/v3, little-endian): magic, version, tensor count, key-value count; the key-value pairs
(string key, value type, value); the tensor infos (name, dims, type, offset); padding to the alignment;
the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from specdec.errors import CorruptModelError

MAGIC = b"GGUF"
# Arrays at most this long are kept (rope sections, per-layer head counts); longer ones are skipped.
SHORT_ARRAY = 1024

# value type -> struct format of one element (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# numpy dtypes GGUFReader keeps these tensor types in; every other type is uint8 rows of whole blocks
_PLAIN_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                 "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array too long to keep: its element type and length."""

    element_type: int
    length: int
    position: int = 0  # where its elements start in the file (GgufFile.strings reads a string array there)


@dataclass
class GgufTensor:
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first (as GGUFReader's `shape`)
    data_offset: int  # absolute, in the file
    n_bytes: int
    _buffer: object  # the file's memory map

    @cached_property
    def data(self) -> np.ndarray:
        """A read-only view of the tensor's bytes in the file, typed and shaped as GGUFReader's `data`."""
        dims = tuple(reversed(self.shape))
        kind = _PLAIN_DTYPES.get(self.tensor_type.name)
        if kind is not None:
            return np.frombuffer(self._buffer, dtype=kind, count=self.n_bytes // np.dtype(kind).itemsize,
                                 offset=self.data_offset).reshape(dims)
        return np.frombuffer(self._buffer, dtype=np.uint8, count=self.n_bytes,
                             offset=self.data_offset).reshape(quant_shape_to_byte_shape(dims, self.tensor_type))

    def drop_pages(self, first_row: int = 0, stop_row: int | None = None) -> None:
        """Unmap the tensor's pages (of rows first_row..stop_row only, if given) from this process once they are
        decoded; they stay in the page cache. A load that reads a file tensor by tensor then holds one
        tensor's pages at a time, not the file's."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return  # not offered on this platform: the pages stay mapped, as any mapped file's
        rows = self.shape[-1] if len(self.shape) > 1 else 1
        row_bytes = self.n_bytes // rows
        begin = self.data_offset + first_row * row_bytes
        end = self.data_offset + (self.n_bytes if stop_row is None else min(rows, stop_row) * row_bytes)
        start = begin - begin % mmap.PAGESIZE
        self._buffer.madvise(mmap.MADV_DONTNEED, start, min(end, len(self._buffer)) - start)


class GgufFile:
    """The metadata (`field`) and tensors (`tensors`, `tensor`) of one GGUF file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as handle:
                self._buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
            raise CorruptModelError(f"{self.path}: not a readable GGUF file ({exc})") from None
        try:
            self.fields, self.tensors = self._parse()
        except (struct.error, UnicodeDecodeError, ValueError, KeyError, IndexError) as exc:
            raise CorruptModelError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        self._by_name = {tensor.name: tensor for tensor in self.tensors}

    def field(self, key: str, default=None):
        """A metadata value (a number, a string, a list of a short array's elements); `default` when absent.
        A long array's value is a SkippedArray."""
        return self.fields.get(key, default)

    def tensor(self, name: str) -> GgufTensor:
        return self._by_name[name]

    def strings(self, key: str) -> list[str]:
        """A string array's elements (a long one, such as the tokenizer's tokens, read only when asked for)."""
        value = self.fields.get(key)
        if not isinstance(value, SkippedArray):
            return list(value or [])
        if value.element_type != _STRING:
            raise CorruptModelError(f"{self.path}: {key} is not an array of strings")
        strings, position = [], value.position
        for _ in range(value.length):
            text, position = self._string(position)
            strings.append(text)
        return strings

    # -- parsing ------------------------------------------------------------------------------
    def _parse(self) -> tuple[dict, list[GgufTensor]]:
        buffer = self._buffer
        if buffer[:4] != MAGIC:
            raise ValueError("no GGUF magic number")
        version, tensor_count, field_count = struct.unpack_from("<IQQ", buffer, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 and 3 are read)")
        position = 24
        fields = {}
        for _ in range(field_count):
            key, position = self._string(position)
            (value_type,), position = struct.unpack_from("<I", buffer, position), position + 4
            fields[key], position = self._value(value_type, position)
        infos = []
        for _ in range(tensor_count):
            name, position = self._string(position)
            (dims,), position = struct.unpack_from("<I", buffer, position), position + 4
            shape = struct.unpack_from(f"<{dims}Q", buffer, position)
            position += 8 * dims
            tensor_type, offset = struct.unpack_from("<IQ", buffer, position)
            position += 12
            infos.append((name, shape, GGMLQuantizationType(tensor_type), offset))
        alignment = int(fields.get("general.alignment", 32))
        data_start = -(-position // alignment) * alignment
        tensors = []
        for name, shape, tensor_type, offset in infos:
            block, size = GGML_QUANT_SIZES[tensor_type]
            n_bytes = int(np.prod(shape, dtype=np.int64)) // block * size
            start = data_start + offset
            if start + n_bytes > len(buffer):
                raise ValueError(f"tensor {name} runs past the end of the file (truncated?)")
            tensors.append(GgufTensor(name, tensor_type, tuple(int(d) for d in shape), start, n_bytes, buffer))
        return fields, tensors

    def _string(self, position: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", self._buffer, position)
        start = position + 8
        return bytes(self._buffer[start:start + length]).decode("utf-8"), start + length

    def _value(self, value_type: int, position: int):
        if value_type == _STRING:
            return self._string(position)
        if value_type in _SCALARS:
            form = "<" + _SCALARS[value_type]
            return struct.unpack_from(form, self._buffer, position)[0], position + struct.calcsize(form)
        if value_type != _ARRAY:
            raise ValueError(f"unknown metadata value type {value_type}")
        element_type, length = struct.unpack_from("<IQ", self._buffer, position)
        position += 12
        if length > SHORT_ARRAY:
            return SkippedArray(element_type, length, position), self._skip_array(element_type, length, position)
        values = []
        for _ in range(length):
            value, position = self._value(element_type, position)
            values.append(value)
        return values, position

    def _skip_array(self, element_type: int, length: int, position: int) -> int:
        """The position after an array that is not kept."""
        if element_type in _SCALARS:
            return position + length * struct.calcsize("<" + _SCALARS[element_type])
        if element_type != _STRING:
            for _ in range(length):  # nested arrays: walk them
                _, position = self._value(element_type, position)
            return position
        unpack, buffer = struct.Struct("<Q").unpack_from, self._buffer
        for _ in range(length):  # each string: its length, then its bytes
            position += 8 + unpack(buffer, position)[0]
        return position
