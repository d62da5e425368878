"""Physical KV blocks: BlockPool (reference counts, free list, prefix index, LRU of cached blocks)
and the chained block hash that names a full block's contents."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Protocol


def chain_hash(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """Hash of a full block: SHA-256 of its parent's hash and its own token ids.

    Collision resistant (unlike Python's ``hash``), so two different prefixes never share KV.
    """
    return hashlib.sha256((parent or b"") + array("q", tokens).tobytes()).digest()


def extend_hashes(hashes: list[bytes], token_ids: list[int], block_size: int) -> list[bytes]:
    """Extend ``hashes``, the chain hashes of a token sequence's leading full blocks, to every
    full block of ``token_ids`` (it grows: each block is hashed once); returns it."""
    parent = hashes[-1] if hashes else None
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = chain_hash(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def cpu_entry(block: int) -> int:
    """How a block-table entry names CPU block ``block`` (negative; device ids are >= 0)."""
    return -1 - block


class Readers(Protocol):
    """Who may be reading indexed blocks' bytes in place off the engine thread (the disk tier's
    writer): an evicted block is about to be overwritten, so its readers must let go first."""

    def busy(self, block: int) -> bool:
        """Whether ``block``'s bytes are still to be read."""
        ...

    def claim(self, block: int, wait: bool) -> bool:
        """Let go of ``block`` (taking what it still needs of it) and return True; a block being
        read right now is let go of once that read is done when ``wait``, else not (False)."""
        ...


class BlockPool:
    """A fixed set of physical blocks with reference counts.

    A block is *used* (ref > 0), *cached* (ref 0, still in the hash index, evictable LRU-first) or
    *free* (ref 0, unindexed). Allocation prefers free blocks, then evicts the least recently
    released cached block that no ``readers`` are busy with; when each is one of those, one its
    readers let go of (`Readers.claim`).
    """

    def __init__(self, num_blocks: int, readers: Readers | None = None) -> None:
        self.num_blocks = num_blocks
        self.readers = readers
        self.ref = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.pin_count = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, bytes] = OrderedDict()  # block -> its hash
        self._index: dict[bytes, int] = {}
        self.num_used = 0
        self.num_pinned = 0
        self.num_shared = 0
        self.evictions = 0

    # -- counts --------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free plus evictable cached)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._evictable)

    @property
    def num_unindexed_free(self) -> int:
        return len(self._free)

    # -- allocation and references ---------------------------------------------------------------
    def allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block = self._victim()
            stale = self._evictable.pop(block)
            del self._index[stale]
            self.block_hash[block] = None
            self.evictions += 1
        else:
            raise RuntimeError("BlockPool exhausted: the scheduler must check can_allocate first")
        self.ref[block] = 1
        self.num_used += 1
        return block

    def _victim(self) -> int:
        """The cached block to evict: the least recently released one no reader is busy with,
        else one its reader lets go of at once, else the least recently released one, once its
        reader let go."""
        readers = self.readers
        if readers is None:
            return next(iter(self._evictable))
        for block in self._evictable:
            if not readers.busy(block):
                return block
        for block in self._evictable:
            if readers.claim(block, wait=False):
                return block
        block = next(iter(self._evictable))
        readers.claim(block, wait=True)
        return block

    def incref(self, block: int) -> None:
        r = self.ref[block]
        if r == 0:
            del self._evictable[block]
            self.num_used += 1
        elif r == 1:
            self.num_shared += 1
        self.ref[block] = r + 1

    def decref(self, block: int) -> None:
        r = self.ref[block] - 1
        assert r >= 0, f"block {block} released more often than referenced"
        self.ref[block] = r
        if r == 1:
            self.num_shared -= 1
        elif r == 0:
            self.num_used -= 1
            if (cached := self.block_hash[block]) is not None:
                self._evictable[block] = cached  # most recently released: evicted last
            else:
                self._free.append(block)

    # -- prefix index ----------------------------------------------------------------------------
    def lookup(self, block_hash: bytes) -> int | None:
        return self._index.get(block_hash)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def register(self, block: int, block_hash: bytes) -> None:
        """Index a full block by its chain hash (first writer wins; duplicates stay unindexed)."""
        if self.block_hash[block] is None and block_hash not in self._index:
            self._index[block_hash] = block
            self.block_hash[block] = block_hash

    # -- pins ------------------------------------------------------------------------------------
    def pin(self, block: int) -> None:
        self.incref(block)
        if self.pin_count[block] == 0:
            self.num_pinned += 1
        self.pin_count[block] += 1

    def unpin(self, block: int) -> None:
        self.pin_count[block] -= 1
        if self.pin_count[block] == 0:
            self.num_pinned -= 1
        self.decref(block)
