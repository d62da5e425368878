"""A GGUF file's header (metadata and tensor table) and its tensors, read from a memory map.

gguf-py's ``GGUFReader`` parses every metadata array into numpy objects one element at a time:
on the default model (a 49,152-token vocabulary and its merges) it took 2.9-4 s of CPU before the
first tensor. This reader walks the header once with ``struct`` (strings of a string array are
decoded in one pass over the map), so a file is checked in milliseconds, before any heavy work;
the tensors stay in the map until one is asked for, and are dequantized one at a time: by the
native kernel (``csrc/cpu/dequant.cpp``: each block read once and its values written once, into
the tensor the caller keeps) or, without the native kernels, by ``engine/load/dequant.py`` (torch ops
doing gguf-py's ``gguf.quants`` steps); both are bit-exact with gguf.quants.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chatpage.engine.load import dequant
from chatpage.engine.model import ops

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# metadata value types: the fixed-size ones by struct format; 8 is a string, 9 an array
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
MAX_ARRAY_DEPTH = 8  # arrays of arrays nest this deep at most (real files: 1)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS

# The ggml tensor types chatpage loads: type id -> (name, values per block, bytes per block).
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18),
    23: ("IQ4_XS", 256, 136),
}


# a model split by llama.cpp's gguf-split: NAME-00001-of-00003.gguf, NAME-00002-of-00003.gguf, ...
SPLIT_NAME = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf")
MAX_PARTS = 9999


def model_files(path: Path) -> list[Path]:
    """The files of the model whose (first) file is ``path``: itself, or for
    ``NAME-00001-of-0000N.gguf`` its N parts, by name (whether they exist or not)."""
    named = SPLIT_NAME.fullmatch(path.name)
    if named is None:
        return [path]
    count, width = int(named[3]), len(named[2])
    return [
        path.with_name(f"{named[1]}-{part:0{width}d}-of-{named[3]}.gguf")
        for part in range(1, count + 1)
    ]


class GGUFError(ValueError):
    """The file is not a GGUF chatpage can read; the message says why in one line."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` in torch order (rows first), where its bytes are."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the file
    nbytes: int
    part: int = 0  # which file of a split model holds it (0: the first, or the only one)

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES[self.type_id][0]


class _Cursor:
    """Reads little-endian values from a buffer, front to back; every count it is given is
    checked against the bytes left, so a hostile count fails at once in one line."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def count(self, what: str, each: int) -> int:
        """A 64-bit count of items of at least ``each`` bytes that must still fit in the file."""
        n = self.scalar("<Q")
        if n * each > self.left():
            raise GGUFError(f"{self.path}: {what} {n} does not fit in the {self.left()} bytes left")
        return int(n)

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.count("a string of length", 1)
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFError(f"{self.path}: unknown metadata value type {kind}")
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(
                f"{self.path}: metadata arrays nest deeper than {MAX_ARRAY_DEPTH} levels"
            )
        item = self.scalar("<I")
        if item in _SCALARS:
            dtype = np.dtype(_SCALARS[item].replace("?", "b1"))
            count = self.count("an array of length", dtype.itemsize)
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            return values.tolist()
        # a string takes 8 bytes at least, an array 12
        count = self.count("an array of length", 8 if item == _STRING else 12)
        return [self.value(item, depth + 1) for _ in range(count)]


class GGUFFile:
    """A GGUF file's metadata (``metadata``: key -> value, arrays as lists) and tensor table
    (``tensors``: name -> :class:`TensorInfo`), over a read-only memory map of the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._maps: list[mmap.mmap] = []  # one read-only map per file (a split model has several)
        self.metadata, self.tensors = self._open(path, 0)
        self.parts = [path]
        count = self.metadata.get("split.count", 1)
        if count != 1:
            self._open_parts(count)

    def _open(self, path: Path, part: int) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
        """Map file ``part`` of the model and read its header."""
        try:
            with path.open("rb") as f:
                self._maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        except (OSError, ValueError) as e:
            raise GGUFError(f"cannot read {path}: {e}") from None
        try:
            return self._read_header(path, part)
        except (struct.error, UnicodeDecodeError, IndexError) as e:
            raise GGUFError(f"{path} is not a readable GGUF file (truncated header: {e})") from None

    def _open_parts(self, count: object) -> None:
        """The other files of a model split by llama.cpp's gguf-split (``NAME-00001-of-00003.gguf``
        and its siblings, in one folder): their tensors join the first file's table."""
        named = SPLIT_NAME.fullmatch(self.path.name)
        if type(count) is not int or not 1 < count <= MAX_PARTS or named is None:
            raise GGUFError(
                f"{self.path}: split.count is {count!r}; a split model is opened by its first "
                "part, named NAME-00001-of-0000N.gguf"
            )
        if int(named[2]) != 1 or int(named[3]) != count:
            raise GGUFError(f"{self.path}: open a split model by its first part (-00001-of-)")
        for part, path in enumerate(model_files(self.path)[1:], start=1):
            if not path.is_file():
                raise GGUFError(f"{self.path}: part {part + 1} of {count} is missing ({path.name})")
            metadata, tensors = self._open(path, part)
            if metadata.get("split.no") != part or metadata.get("split.count") != count:
                raise GGUFError(f"{path} is not part {part + 1} of {self.path.name}'s {count}")
            if tensors.keys() & self.tensors.keys():
                raise GGUFError(f"{path} repeats a tensor of an earlier part")
            self.tensors.update(tensors)
            self.parts.append(path)
        want = self.metadata.get("split.tensors.count", len(self.tensors))
        if want != len(self.tensors):
            raise GGUFError(
                f"{self.path}: its parts hold {len(self.tensors)} tensors, not the {want} it names"
            )

    def _read_header(self, path: Path, part: int) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
        buf = self._maps[part]
        c = _Cursor(buf, path)
        if buf[:4] != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (no GGUF magic at its start)")
        c.pos = 4
        version = c.scalar("<I")
        if version not in VERSIONS:
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3 are)")
        # a tensor's entry takes 24 bytes at least (name length, dims, type, offset), a
        # key's 13 (key length, type, a one-byte value)
        n_tensors = c.count("the tensor count", 24)
        n_kv = c.count("the metadata key count", 13)
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.scalar("<I"))
        raw = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.scalar("<I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(
                    f"{path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} are)"
                )
            dims = [c.scalar("<Q") for _ in range(n_dims)]
            raw.append((name, tuple(reversed(dims)), c.scalar("<I"), c.scalar("<Q")))
        align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(align) is not int or align < 1 or align & (align - 1):
            shown = align if type(align) is int else f"a {type(align).__name__}"
            raise GGUFError(f"{path}: general.alignment must be a power of two, not {shown}")
        start = (c.pos + align - 1) // align * align
        tensors = {}
        for name, shape, type_id, offset in raw:
            if type_id not in TENSOR_TYPES:
                known = ", ".join(t[0] for t in TENSOR_TYPES.values())
                raise GGUFError(
                    f"{path}: tensor {name!r} has ggml type {type_id}, which "
                    f"chatpage cannot read (it reads {known})"
                )
            _, block, block_bytes = TENSOR_TYPES[type_id]
            count = math.prod(shape)  # (Python's integers: no overflow)
            if shape[-1] % block:
                raise GGUFError(
                    f"{path}: tensor {name!r} rows of {shape[-1]} values do not "
                    f"split into {TENSOR_TYPES[type_id][0]} blocks of {block}"
                )
            info = TensorInfo(
                name, shape, type_id, start + offset, count // block * block_bytes, part
            )
            if info.offset + info.nbytes > len(buf):
                raise GGUFError(f"{path} is truncated (tensor {name!r} ends past the file)")
            tensors[name] = info
        return metadata, tensors

    def blocks(self, name: str) -> torch.Tensor:
        """The stored blocks of tensor ``name``, ``[n_blocks, block_bytes]`` uint8 over the map
        (never written: the map is read-only, so torch's warning about that is silenced)."""
        info = self.tensors[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(
                self._maps[info.part], dtype=torch.uint8, count=info.nbytes, offset=info.offset
            )
        return data.view(-1, TENSOR_TYPES[info.type_id][2])

    def dequantize(
        self, name: str, out: torch.Tensor | None = None, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tensor ``name`` as fp32 in its torch shape, into ``out`` (contiguous, of that shape)
        when given, row i from the file's row ``rows[i]`` when given; bit-exact with gguf-py's
        ``gguf.quants``: by the native kernel where the kernels are loaded, else by
        ``engine/load/dequant.py``'s torch ops."""
        info = self.tensors[name]
        return _dequantize(self.blocks(name), info.type_id, info.shape, out, rows)

    def release(self, name: str) -> None:
        """Let the kernel take back the pages of tensor ``name`` read so far (they count in the
        process's RSS until then: a whole file once every tensor is read). Only drops them from
        this process: a later read maps them again from the file."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page  # whole pages inside the tensor only
        stop = (info.offset + info.nbytes) // page * page
        if stop > start:
            self._maps[info.part].madvise(mmap.MADV_DONTNEED, start, stop - start)

    def dequantize_rows(
        self, name: str, start: int, stop: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rows ``start:stop`` of the 2-D tensor ``name`` as fp32 (each row's blocks are
        contiguous in the file: only those are read), into ``out`` (contiguous, of their shape)
        when given."""
        info = self.tensors[name]
        per_row = info.shape[1] // TENSOR_TYPES[info.type_id][1]
        blocks = self.blocks(name)[start * per_row : stop * per_row]
        return _dequantize(blocks, info.type_id, (stop - start, info.shape[1]), out)


def _dequantize(
    blocks: torch.Tensor,
    type_id: int,
    shape: tuple[int, ...],
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``blocks`` of ``type_id`` as fp32 of ``shape`` (into ``out`` when given; row i from row
    ``rows[i]`` when given): by the native kernel where the kernels are loaded, else by
    ``engine/load/dequant.py``'s torch ops."""
    if not ops.available(torch.device("cpu")):
        w = dequant.dequantize(blocks, type_id).view(shape)
        w = w if rows is None else w.index_select(0, rows)
        return w if out is None else out.copy_(w)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    torch.ops.chatpage.dequantize_gguf(blocks, type_id, out, rows)
    return out
