"""A Hugging Face checkpoint's safetensors read tensor by tensor, straight into the engine's device
and dtype: host memory holds one tensor at a time, never the whole model.

:class:`StreamedState` is the checkpoint as a mapping of HF names that reads a tensor when it is
taken (``weights.fuse_state`` pops them one by one), converted on the way to the device and
dtype its key asks for. Files are read with plain reads rather than ``safetensors.safe_open``:
safe_open maps the whole file, and every page it touches stays in the process's resident memory
until the file is closed (measured: a 384 MB fp32 file read through safe_open into bf16 peaked at
580 MB of RSS, file plus copy); a plain read leaves only the page cache, which is not the
process's. A 7B model (28 GB in fp32, 14 GB in bf16) so loads onto a GPU from a 16 GB machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute offset of the tensor's bytes in the file
    end: int


def read_header(path: Path) -> dict[str, _Entry]:
    """The tensors of one safetensors file (name -> where its bytes are), from its JSON header."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a safetensors file ({e})") from None
    base = 8 + size
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(
                f"{path}: tensor {name} has dtype {info['dtype']}, which chatpage cannot read"
            )
        start, end = info["data_offsets"]
        entries[name] = _Entry(
            path, _DTYPES[info["dtype"]], tuple(info["shape"]), base + start, base + end
        )
    return entries


def read_tensor(entry: _Entry) -> torch.Tensor:
    """One tensor's bytes read from its file into a fresh host tensor (no mapping kept)."""
    nbytes = entry.end - entry.start
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        view = buffer.numpy().data
        with open(entry.path, "rb", buffering=0) as f:
            f.seek(entry.start)
            done = 0
            while done < nbytes:
                got = f.readinto(view[done:])
                if not got:
                    raise ValueError(f"{entry.path} is truncated")
                done += got
    return buffer.view(entry.dtype).view(entry.shape)


class StreamedState(MutableMapping[str, torch.Tensor]):
    """The tensors of ``files`` by name, each read when taken and moved to ``device`` in
    ``dtype_of(name)`` (None: its stored dtype); a tensor taken once is read again if taken
    again. Setting a name stores that tensor instead; deleting forgets it."""

    def __init__(
        self, files: list[Path], device: torch.device, dtype_of: Callable[[str], torch.dtype | None]
    ) -> None:
        self.device = device
        self.dtype_of = dtype_of
        self._entries: dict[str, _Entry] = {}
        for path in files:
            self._entries.update(read_header(path))
        self._set: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._set:
            return self._set[name]
        host = read_tensor(self._entries[name])
        dtype = self.dtype_of(name) if host.is_floating_point() else None
        return host.to(device=self.device, dtype=dtype or host.dtype)

    def __setitem__(self, name: str, tensor: torch.Tensor) -> None:
        self._set[name] = tensor

    def __delitem__(self, name: str) -> None:
        if name not in self._set and name not in self._entries:
            raise KeyError(name)
        self._set.pop(name, None)
        self._entries.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._set or name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._entries, *self._set]))

    def __len__(self) -> int:
        return len(self._entries.keys() | self._set.keys())

    def clear(self) -> None:
        """Forget every tensor without reading any."""
        self._entries.clear()
        self._set.clear()


MATMUL_SUFFIXES = ("_proj.weight", "lm_head.weight")
"""The HF names of the matmul weights (the rest: embeddings, norms, biases)."""


def streamed_checkpoint(
    directory: Path, device: torch.device, dtype: torch.dtype, matmul_dtype: torch.dtype
) -> StreamedState | None:
    """The safetensors of an HF directory as a :class:`StreamedState`: matmul weights in
    ``matmul_dtype``, everything else in ``dtype``; None when it has no safetensors files."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None

    def dtype_of(name: str) -> torch.dtype:
        return matmul_dtype if name.endswith(MATMUL_SUFFIXES) else dtype

    return StreamedState(files, device, dtype_of)
