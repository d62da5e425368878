"""The disk tier under the device's prefix cache: full KV blocks kept as files, so a prefix is
computed once per install, not once per process.

A block's file is ``root/<namespace>/<key hex>.kv``, where the key is its prefix-index key (the
chained block hash, per KV group: ``engine/core/block_table.py`` ``group_key``) and the namespace
a digest of everything that makes the bytes valid (`namespace_of`: the weights' content digest,
their format, the KV format, the model config, the window layout, `TIER_VERSION`). A file holds a
header (`HEADER`: magic, namespace, key length, token count, payload length, the payload's
CRC-32), the key, the block's token ids (int64) and the payload: the block's bytes in each of the
KV cache's block tensors, in their order. Reading checks every part against what is asked for:
anything odd (another namespace, other tokens, a short or unreadable file) is a miss, never an
error. Writes go to a temp file named after the writing process, then ``os.replace``: a process
killed mid-write leaves a temp file (removed at the next start, once its process is gone), never
a torn block. Two processes on one folder each keep their own index and tolerate the other's
files appearing (a lookup the index misses looks for the file) and vanishing (a miss).

Writes run on the tier's own thread, which reads a block's bytes in place, in the pool:
`DiskTier.save` only queues the block, so the engine's step neither waits on a write nor copies
the block. A queued block stays indexed in the pool, where lookups share it as any cached block
(nobody writes into an indexed block); the pool evicts it last, and only after `DiskTier.claim`:
a block whose write has not started is copied then (the write goes on from the copy), one being
written is waited for (one file write). With ``read_ahead`` (a GPU's pool, by default), reads
start on a thread of their own from when a request is added (`DiskTier.prefetch`), into host
memory, while earlier steps run (the scheduler lets a request whose blocks are still being read
wait while others run);
`DiskTier.read` then takes them, or reads synchronously, on the engine thread, what has not
arrived: a block is one file read from the page cache, far cheaper than recomputing it
(docs/benchmarks.md, ``chatpage bench resume``). The folder's size is bounded by ``capacity``
bytes over every namespace together: the least recently used files (by mtime; a read touches
its file) go first, down to `LOW_WATER` of the bound so that the folder is not listed again at
every write. Other processes' writes count once this one lists the folder again: when its own
count passes the bound, and after every `RESCAN` share of the bound it wrote itself, so that
``P`` processes writing at once take the folder at most ``P * RESCAN`` of the bound over it,
for as long as it takes the next of them to list it.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TIER_VERSION = 1
"""chatpage's version of the tier's file format (and of what the namespace digests)."""

MAGIC = b"chatpKV\x01"
HEADER = struct.Struct("<8s32sIIQI")  # magic, namespace, key length, tokens, payload bytes, crc
SUFFIX = ".kv"
TEMP = ".tmp"
LOW_WATER = 0.9  # eviction frees down to this share of the bound
RESCAN = 0.05  # share of the bound a process writes between listings of the folder
MAX_PENDING = 256 << 20  # bytes of blocks queued for writing; more are dropped (a later miss)
MAX_AHEAD = 256 << 20  # bytes of blocks read ahead and not taken yet; more are read when needed


@dataclass(slots=True)
class _Queued:
    """A block waiting for its write: its ``tokens``, read from pool ``block`` in place, or from
    ``payload`` once the pool claimed the block back (`DiskTier.claim`)."""

    tokens: tuple[int, ...]
    block: int | None
    payload: torch.Tensor | None = None
    # on a GPU: recorded on the engine's stream as the block was queued (its last write before
    # it), waited for before the tier's thread copies the block out of the pool
    written: torch.cuda.Event | None = None


@dataclass(slots=True)
class _Ahead:
    """A block read ahead for ``tokens``: its ``payload`` once ``done`` (None: not readable)."""

    tokens: tuple[int, ...]
    payload: torch.Tensor | None = None
    done: bool = False


def namespace_of(identity: Mapping[str, Any]) -> bytes:
    """The 32-byte digest of ``identity`` (JSON-able: what makes a block's KV bytes valid)."""
    blob = json.dumps({"tier": TIER_VERSION, **identity}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).digest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@dataclass(frozen=True, slots=True)
class TierUsage:
    """What a tier folder holds: files and bytes, over every namespace."""

    files: int
    bytes: int
    namespaces: int


def _scan(root: Path) -> OrderedDict[Path, int]:
    """Every block file under ``root``, least recently used first, with its size; temp files
    left by processes that are gone are removed on the way. Files vanishing meanwhile (another
    process evicting) are skipped."""
    found: list[tuple[int, Path, int]] = []
    try:
        folders = [d for d in os.scandir(root) if d.is_dir(follow_symlinks=False)]
    except OSError:
        return OrderedDict()
    for folder in folders:
        try:
            entries = list(os.scandir(folder.path))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            try:
                if name.endswith(SUFFIX):
                    st = entry.stat(follow_symlinks=False)
                    found.append((st.st_mtime_ns, Path(entry.path), st.st_size))
                elif name.endswith(TEMP) and not _pid_alive(int(name.split(".")[-2])):
                    os.unlink(entry.path)
            except (OSError, ValueError):
                continue
    found.sort(key=lambda f: f[0])
    return OrderedDict((path, size) for _, path, size in found)


def tier_usage(root: Path) -> TierUsage:
    """The files and bytes of the tier folder ``root`` (`chatpage cache` shows them)."""
    files = _scan(root)
    return TierUsage(len(files), sum(files.values()), len({p.parent for p in files}))


def clear_tier(root: Path) -> int:
    """Remove every block file under ``root``; returns the bytes freed."""
    freed = 0
    for path, size in _scan(root).items():
        try:
            path.unlink()
            freed += size
        except OSError:
            continue
    return freed


@dataclass(frozen=True, slots=True)
class TierStats:
    """The disk tier as the gauge and /metrics show it."""

    blocks: int  # this namespace's blocks on disk (as this process last saw them)
    bytes: int  # the folder's bytes, every namespace
    capacity: int
    hits: int  # blocks read back from disk
    writes: int  # blocks written
    dropped: int  # writes given up (the write queue full, or the disk refused)
    misses: int  # files found but unreadable or not what was asked for
    pending: int  # blocks queued for writing
    claimed: int  # queued blocks the pool took back before their write (copied for it then)
    prefetched: int  # of hits, blocks read ahead before the step that took them


class DiskTier:
    """Full KV blocks of one namespace under ``root``, within ``capacity`` bytes.

    ``tensors``: the KV cache's per-block tensors (block index first, ``KVCache.block_tensors``);
    block ``b``'s payload is ``t[b]``'s bytes for each, in order. ``read_ahead``: whether
    `prefetch` reads anything."""

    def __init__(
        self,
        root: Path,
        identity: Mapping[str, Any],
        tensors: Sequence[torch.Tensor],
        capacity: int,
        max_pending: int = MAX_PENDING,
        read_ahead: bool = True,
    ) -> None:
        self.root = root
        self.namespace = namespace_of(identity)
        self.folder = root / self.namespace.hex()[:32]
        self.folder.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.max_pending = max_pending
        self._tensors = list(tensors)
        self._sizes = [t[0].numel() * t.element_size() for t in self._tensors]
        self.block_bytes = sum(self._sizes)
        self._lock = threading.Lock()
        self._files: OrderedDict[Path, int] = OrderedDict()  # the root's, LRU first
        self._keys: set[bytes] = set()  # this namespace's blocks on disk
        self._used = 0
        self._written = 0  # bytes this process wrote since it last listed the folder
        self._adopt(_scan(root))
        self._pending: dict[bytes, _Queued] = {}
        self._pending_bytes = 0
        self._in_place: dict[int, bytes] = {}  # pool block -> its key, queued to be read in place
        self._writing: int | None = None  # the pool block the writer is reading now
        self._done = threading.Condition(self._lock)
        self.hits = self.writes = self.dropped = self.misses = self.claimed = self.prefetched = 0
        self.read_ahead = read_ahead
        self._ahead: dict[bytes, _Ahead] = {}
        self._ahead_bytes = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._reads: queue.Queue[bytes | None] = queue.Queue()
        # the writer at the lowest priority: on a machine whose cores the engine's threads all
        # use, it takes the time they leave (one of them preempted stalls a whole step); the
        # reader at the engine's own (a request waits for what it reads)
        self._writer = threading.Thread(
            target=self._serve, args=(self._queue, self._write_one, 19), name="chatpage-kv-disk"
        )
        self._reader = threading.Thread(
            target=self._serve, args=(self._reads, self._read_one, 0), name="chatpage-kv-read"
        )
        for thread in (self._writer, self._reader):
            thread.daemon = True
            thread.start()

    def _adopt(self, files: OrderedDict[Path, int]) -> None:
        """Take ``files`` (a fresh `_scan`) as what the folder holds (call under the lock, or
        before the writer starts)."""
        self._files = files
        self._used = sum(files.values())
        self._keys = set()
        for path in files:
            if path.parent == self.folder:
                try:
                    self._keys.add(bytes.fromhex(path.stem))
                except ValueError:
                    continue

    def _path(self, key: bytes) -> Path:
        return self.folder / f"{key.hex()}{SUFFIX}"

    # -- the engine thread's side ----------------------------------------------------------------
    def has(self, key: bytes) -> bool:
        """Whether block ``key`` is on disk or queued for writing: known to this process, or
        its file is there (another process on the folder wrote it since this one last listed
        it; taken into the books then)."""
        with self._lock:
            if key in self._keys or key in self._pending:
                return True
        path = self._path(key)
        try:
            size = path.stat().st_size
        except OSError:
            return False
        with self._lock:
            self._keys.add(key)
            if path not in self._files:
                self._files[path] = size
                self._used += size
        return True

    def save(self, blocks: Sequence[tuple[int, bytes, tuple[int, ...]]]) -> None:
        """Queue pool blocks for writing, each ``(block, key, tokens)`` (full, indexed in the
        pool under ``key``, its ``tokens``): the tier's thread reads them in place, so the
        pool must `claim` one before it overwrites it. Blocks that would overfill the queue are
        dropped (a later miss)."""
        queued = []
        written = None
        if blocks and self._tensors[0].is_cuda:
            written = torch.cuda.Event()
            written.record()
        with self._lock:
            for block, key, tokens in blocks:
                if key in self._keys or key in self._pending or block in self._in_place:
                    continue
                if self._pending_bytes + self.block_bytes > self.max_pending:
                    self.dropped += 1
                    continue
                self._pending[key] = _Queued(tokens, block, written=written)
                self._in_place[block] = key
                self._pending_bytes += self.block_bytes
                queued.append(key)
        for key in queued:
            self._queue.put(key)

    def busy(self, block: int) -> bool:
        """Whether pool block ``block`` is queued to be read in place (`Readers.busy`)."""
        with self._lock:
            return block in self._in_place

    def claim(self, block: int, wait: bool = True) -> bool:
        """Let go of pool block ``block`` before the pool overwrites it (`Readers.claim`): copy
        its bytes for its write if that has not started yet; if it is being written now, wait
        for that when ``wait`` (else return False, still busy)."""
        with self._lock:
            while self._writing == block:
                if not wait:
                    return False
                self._done.wait()
            key = self._in_place.pop(block, None)
            if key is None:
                return True
            queued = self._pending[key]
            queued.payload = torch.cat([self._piece(t, block) for t in self._tensors]).cpu()
            queued.block = None
            self.claimed += 1
            return True

    def in_place(self) -> dict[int, bytes]:
        """The pool blocks queued to be read in place, with their keys (for an audit)."""
        with self._lock:
            return dict(self._in_place)

    @staticmethod
    def _piece(t: torch.Tensor, block: int) -> torch.Tensor:
        return t[block].reshape(-1).view(torch.uint8)

    def prefetch(self, blocks: Sequence[tuple[bytes, tuple[int, ...]]]) -> None:
        """Start reading blocks ``(key, tokens)`` into host memory on the tier's reading thread,
        for `read` to take (within `MAX_AHEAD` bytes not taken yet; the rest are read when
        needed). Nothing without ``read_ahead``."""
        if not self.read_ahead:
            return
        with self._lock:
            fresh = [(k, t) for k, t in blocks if k not in self._ahead and k not in self._pending]
            room = max(0, (MAX_AHEAD - self._ahead_bytes) // self.block_bytes)
            for key, tokens in fresh[:room]:
                self._ahead[key] = _Ahead(tokens)
                self._reads.put(key)
            self._ahead_bytes += min(room, len(fresh)) * self.block_bytes

    def arrived(self, keys: Sequence[bytes]) -> bool:
        """Whether none of ``keys`` is still being read ahead."""
        with self._lock:
            return all(key not in self._ahead or self._ahead[key].done for key in keys)

    def forget(self, keys: Sequence[bytes]) -> None:
        """Drop what was read ahead under ``keys`` and not taken (the request needs it no
        more)."""
        with self._lock:
            for key in keys:
                if self._ahead.pop(key, None) is not None:
                    self._ahead_bytes -= self.block_bytes

    def read(self, key: bytes, tokens: tuple[int, ...]) -> torch.Tensor | None:
        """Block ``key``'s bytes (checked: for exactly ``tokens``, whole) from the write queue,
        what was read ahead, or its file, for `scatter`; None when the tier does not hold it
        so."""
        with self._lock:
            pending = self._pending.get(key)
            ahead = self._ahead.pop(key, None)
            if ahead is not None:
                self._ahead_bytes -= self.block_bytes
        if pending is not None:
            # (one queued in place is indexed in the pool still, where the lookup finds it)
            return pending.payload if pending.tokens == tokens else None
        path = self._path(key)
        if ahead is not None and ahead.done and ahead.tokens == tokens:
            payload = ahead.payload  # (None: it was no block of ours when read ahead)
            self.prefetched += payload is not None
        else:  # (not arrived yet: read now)
            payload = self._read(path, key, tokens)
        if payload is None:
            with self._lock:
                self._keys.discard(key)
            return None
        try:
            os.utime(path)  # (recently used: evicted last)
        except OSError:
            pass
        with self._lock:
            if path in self._files:
                self._files.move_to_end(path)
        self.hits += 1
        return payload

    def scatter(self, loads: Sequence[tuple[int, torch.Tensor]]) -> None:
        """Write each ``(block, payload)`` (from `read`) into the device pool, in order."""
        for block, payload in loads:
            offset = 0
            for t, size in zip(self._tensors, self._sizes, strict=True):
                t[block].view(-1).view(torch.uint8).copy_(payload[offset : offset + size])
                offset += size

    def _read(self, path: Path, key: bytes, tokens: tuple[int, ...]) -> torch.Tensor | None:
        """The payload of ``path`` if it is block ``key`` of this namespace for ``tokens``,
        whole; else None (counted as a miss when the file was there)."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                token_bytes = array("q", tokens).tobytes()
                if size != HEADER.size + len(key) + len(token_bytes) + self.block_bytes:
                    raise ValueError("size")
                data = bytearray(size)
                if f.readinto(data) != size:
                    raise ValueError("short read")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            with self._lock:
                self.misses += 1
            return None
        magic, namespace, key_len, num_tokens, payload_len, crc = HEADER.unpack_from(data)
        start = HEADER.size + key_len + 8 * num_tokens
        view = memoryview(data)
        if (
            magic != MAGIC
            or namespace != self.namespace
            or key_len != len(key)
            or num_tokens != len(tokens)
            or payload_len != self.block_bytes
            or view[HEADER.size : HEADER.size + key_len] != key
            or view[HEADER.size + key_len : start] != token_bytes
            or zlib.crc32(view[start:]) != crc
        ):
            with self._lock:
                self.misses += 1
            return None
        return torch.frombuffer(data, dtype=torch.uint8, offset=start)

    def flush(self) -> None:
        """Wait until every queued block is written (or dropped) and every block being read
        ahead has arrived."""
        self._queue.join()
        self._reads.join()

    def close(self) -> None:
        """Write what is queued, then stop the tier's threads."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._reads.put(None)
            self._writer.join()
            self._reader.join()

    def stats(self) -> TierStats:
        with self._lock:
            return TierStats(
                len(self._keys),
                self._used,
                self.capacity,
                self.hits,
                self.writes,
                self.dropped,
                self.misses,
                len(self._pending),
                self.claimed,
                self.prefetched,
            )

    def audit(self) -> list[str]:
        """Inconsistencies of the tier's books, if any: the bytes counted are the files', the
        queue's are its blocks', and with nothing queued the folder is within its bound."""
        problems = []
        with self._lock:
            if self._used != sum(self._files.values()):
                problems.append(f"disk tier counts {self._used} bytes, its files hold another")
            queued = len(self._pending) * self.block_bytes
            if queued != self._pending_bytes:
                problems.append(f"disk tier queue counts {self._pending_bytes} bytes, not {queued}")
            if any(self._pending[k].block != b for b, k in self._in_place.items()):
                problems.append("disk tier queues a block in place under another key")
            if not self._pending and self._used > self.capacity:
                problems.append(f"disk tier holds {self._used} bytes over its {self.capacity}")
        return problems

    # -- the tier's threads ----------------------------------------------------------------------
    @staticmethod
    def _serve(jobs: queue.Queue[bytes | None], job: Callable[[bytes], None], nice: int) -> None:
        """Run ``job`` on every key ``jobs`` brings, until it brings None, at ``nice`` (this
        thread's own niceness on Linux)."""
        if nice:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            except (AttributeError, OSError):
                pass  # (elsewhere: at the process's own)
        while True:
            key = jobs.get()
            try:
                if key is None:
                    return
                job(key)
            finally:
                jobs.task_done()

    def _read_one(self, key: bytes) -> None:
        with self._lock:
            ahead = self._ahead.get(key)
        if ahead is not None:  # (else taken or forgotten meanwhile)
            ahead.payload = self._read(self._path(key), key, ahead.tokens)
            ahead.done = True

    def _write_one(self, key: bytes) -> None:
        with self._lock:
            queued = self._pending[key]
            self._writing = queued.block  # (None: from its copy)
        path = self._path(key)
        if queued.payload is not None:
            pieces = [queued.payload]
        else:
            assert queued.block is not None
            if queued.written is not None:
                queued.written.synchronize()
            pieces = [self._piece(t, queued.block).cpu() for t in self._tensors]
        try:
            size = self._write(path, key, queued.tokens, pieces)
        except OSError:
            size = None
        with self._lock:
            del self._pending[key]
            if self._writing is not None:
                del self._in_place[self._writing]
            self._writing = None
            self._done.notify_all()
            self._pending_bytes -= self.block_bytes
            if size is None:
                self.dropped += 1
                return
            self.writes += 1
            self._keys.add(key)
            self._used += size - self._files.pop(path, 0)
            self._files[path] = size
            self._written += size
            over = self._used > self.capacity or self._written > self.capacity * RESCAN
        if over:
            self._evict()

    def _write(
        self, path: Path, key: bytes, tokens: tuple[int, ...], pieces: list[torch.Tensor]
    ) -> int:
        """Write one block file atomically, its payload ``pieces`` in order; returns its size."""
        token_bytes = array("q", tokens).tobytes()
        views = [p.numpy().data for p in pieces]
        crc = 0
        for view in views:
            crc = zlib.crc32(view, crc)
        length = sum(v.nbytes for v in views)
        head = HEADER.pack(MAGIC, self.namespace, len(key), len(tokens), length, crc)
        temp = path.with_name(f".{path.stem}.{os.getpid()}{TEMP}")
        try:
            with open(temp, "wb") as f:
                f.write(head)
                f.write(key)
                f.write(token_bytes)
                for view in views:
                    f.write(view)
            os.replace(temp, path)
        except OSError:
            temp.unlink(missing_ok=True)
            raise
        return len(head) + len(key) + len(token_bytes) + length

    def _evict(self) -> None:
        """List the folder again (every process's files) and, if it is over the bound, bring it
        down to `LOW_WATER` of it, least recently used first."""
        files = _scan(self.root)  # (outside the lock: another process's files count too)
        with self._lock:
            self._adopt(files)
            self._written = 0
            if self._used <= self.capacity:
                return
            target = int(self.capacity * LOW_WATER)
            while self._files and self._used > target:
                path, size = self._files.popitem(last=False)
                try:
                    path.unlink()
                except OSError:
                    pass  # (gone already: another process evicted it)
                self._used -= size
                if path.parent == self.folder:
                    self._keys.discard(bytes.fromhex(path.stem))
