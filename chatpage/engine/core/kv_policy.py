"""How each kind of attention holds its KV blocks: one policy object per KV group.

The block manager keeps every group's table alike and asks its group's policy what differs by
attention type (as vLLM's single-type KV cache managers): which blocks a query still reads, how
long a prefix-cache hit the group can serve, and how many blocks a request holds at its peak.
Full attention reads every block of the sequence; a sliding window reads only the blocks its
window overlaps, so the ones before it are released as the sequence advances.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial


def num_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks that ``num_tokens`` tokens fill."""
    return -(-num_tokens // block_size)


class KVPolicy(ABC):
    """The blocks of one KV group of ``block_size``-token blocks."""

    window = 0  # tokens a query attends back over (0: all of them)

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    @abstractmethod
    def window_start(self, num_tokens: int) -> int:
        """The first block a query at position ``num_tokens`` reads: the blocks before it can
        be released."""

    @abstractmethod
    def longest_hit(self, cached: Callable[[int], bool], n: int) -> int:
        """The longest prefix of at most ``n`` blocks this group can serve from the cache,
        where ``cached(i)`` says whether the sequence's block ``i`` is in it."""

    @abstractmethod
    def peak_blocks(self, prompt_len: int, longest: int, width: int, chunk: int) -> int:
        """The most blocks of this group a request of ``width`` sequences holds at once,
        growing from ``prompt_len`` to ``longest`` tokens in prefill chunks of at most
        ``chunk``."""


class FullAttention(KVPolicy):
    """Every block stays read: a hit is the run of cached leading blocks (and holds for any
    shorter prefix too); the samples share the prompt's full blocks."""

    def window_start(self, num_tokens: int) -> int:
        return 0

    def longest_hit(self, cached: Callable[[int], bool], n: int) -> int:
        for i in range(n):
            if not cached(i):
                return i
        return n

    def peak_blocks(self, prompt_len: int, longest: int, width: int, chunk: int) -> int:
        per_seq = num_blocks(longest, self.block_size)
        return per_seq + (width - 1) * (per_seq - prompt_len // self.block_size)


class SlidingWindow(KVPolicy):
    """A query reads the last ``window`` tokens: the blocks wholly before them are released
    (each stays cached for prefix hits while the pool does not need it), and a hit needs only
    the blocks in the window of its next query."""

    def __init__(self, block_size: int, window: int) -> None:
        super().__init__(block_size)
        self.window = window

    def window_start(self, num_tokens: int) -> int:
        return max(0, (num_tokens - self.window + 1) // self.block_size)

    def longest_hit(self, cached: Callable[[int], bool], n: int) -> int:
        """(vLLM's right-to-left scan: the latest run of cached blocks that covers a window.)"""
        right = n  # the hit the current run of cached blocks would end
        if self.window_start(right * self.block_size) >= right:
            return right  # (a window of one token needs no earlier block)
        for i in range(n - 1, -1, -1):
            if not cached(i):
                right = i
            elif i <= self.window_start(right * self.block_size):
                return right
        return 0

    def peak_blocks(self, prompt_len: int, longest: int, width: int, chunk: int) -> int:
        """A chunk and its window while it prefills, its window (and the block being written)
        per sequence after."""
        per_seq = num_blocks(longest, self.block_size)
        prefill = min(per_seq, num_blocks(self.window + chunk, self.block_size) + 1)
        return max(prefill, width * min(per_seq, num_blocks(self.window, self.block_size) + 2))


def kv_policy(block_size: int, window: int) -> KVPolicy:
    """The policy of a group of ``window`` (0: full attention)."""
    return SlidingWindow(block_size, window) if window else FullAttention(block_size)


def longest_common_hit(
    policies: Sequence[KVPolicy], cached: Callable[[int, int], bool], n: int
) -> int:
    """The longest prefix of at most ``n`` blocks that every group serves (``cached(g, i)``:
    group ``g`` has the sequence's block ``i`` cached): the full-attention groups' hit first
    (it holds for any shorter prefix too), then the sliding groups' until they settle on one
    that all serve (a sliding group's may not hold for a shorter prefix)."""
    full = [g for g, p in enumerate(policies) if not p.window]
    sliding = [g for g, p in enumerate(policies) if p.window]
    for g in full:
        n = policies[g].longest_hit(partial(cached, g), n)
    while sliding:
        m = n
        for g in sliding:
            m = policies[g].longest_hit(partial(cached, g), m)
        if m == n:
            break
        n = m
    return n
