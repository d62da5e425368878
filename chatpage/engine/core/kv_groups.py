"""KV cache groups: which layers share a block table (the hybrid allocator's layout).

A model whose layers all attend the same way (full attention, or one sliding window everywhere)
has one group: every layer reads its K/V through the sequence's one block table, as before. A model
that mixes windows (Gemma 2's 1 : 1, Gemma 3's 5 sliding : 1 full) gets one group per window kind,
split, as vLLM's hybrid KV-cache manager does, into groups of equally many layers: a physical block
is then one page of that many layers in whichever group holds it, so every group draws from one
pool. A sliding group's blocks that leave the window are freed while the full-attention group keeps
its own (``engine/core/block_manager.py``). Layer ``l`` stores its K/V in slot ``layer_slot[l]`` of the
block its group's table names (``engine/model/kv_cache.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVGroups:
    """``windows[g]``: group ``g``'s window in tokens (0 = full attention); ``layer_group[l]`` and
    ``layer_slot[l]``: layer ``l``'s group and its slot in that group's blocks; ``page_layers``:
    the slots in a block (the most layers any group has)."""

    windows: tuple[int, ...]
    layer_group: tuple[int, ...]
    layer_slot: tuple[int, ...]
    page_layers: int

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def group_layers(self, group: int) -> list[int]:
        return [layer for layer, g in enumerate(self.layer_group) if g == group]


def kv_groups(layer_windows: list[int]) -> KVGroups:
    """Group layers by window (``layer_windows[l]``: layer ``l``'s window, 0 = full), the full
    layers first. With one kind of layer, one group of all of them. With several, a page holds as
    many layers as the rarest kind has and each kind is split into groups of that many (its last
    group may leave slots unused, as vLLM pads)."""
    if not layer_windows:
        raise ValueError("a model needs at least one layer")
    if any(w < 0 for w in layer_windows):
        raise ValueError(f"layer windows must be >= 0 (0 = full attention), got {layer_windows}")
    kinds: dict[int, list[int]] = {}
    for layer, w in enumerate(layer_windows):
        kinds.setdefault(w, []).append(layer)
    page = min(len(layers) for layers in kinds.values())
    windows: list[int] = []
    group = [0] * len(layer_windows)
    slot = [0] * len(layer_windows)
    for w in sorted(kinds, key=lambda w: (w != 0, w)):  # full attention is group 0
        layers = kinds[w]
        for start in range(0, len(layers), page):
            for s, layer in enumerate(layers[start : start + page]):
                group[layer], slot[layer] = len(windows), s
            windows.append(w)
    return KVGroups(tuple(windows), tuple(group), tuple(slot), page)
