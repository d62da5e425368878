"""BlockGauge: a live view of the engine's KV block pool, its queues and its speed.

Segments of the device pool, left to right (they add up to ``num_blocks`` exactly):

- pinned: ``blocks_pinned`` - persona prefixes held for every chat to share;
- shared: ``blocks_used - blocks_pinned - blocks_private`` - unpinned blocks read by several
  sequences (prefix-cache hits, forks of samples and beams);
- private: ``blocks_private`` - blocks one sequence holds alone;
- cached: ``blocks_cached`` - unreferenced but still indexed by hash, reusable until evicted;
- free: ``blocks_free`` (never used or evicted; = ``num_blocks - blocks_used - blocks_cached``).

The CPU swap pool is shown as ``swapped/num_cpu_blocks``. `stats` holds the engine's snapshot
unchanged; `segments` is what the bar draws.

Over a remote backend (`RemoteStats`) the gauge shows what that server exposes, labelled with its
name: KV usage, running/waiting requests, prefix-cache hit rate, tokens/s, preemptions (a dash for
a figure it does not report), plus the block bar when the server is a chatpage serve.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from chatpage.config.settings import format_size
from chatpage.engine.client import EngineStats
from chatpage.remote.stats import RemoteStats
from chatpage.ui.text import clean

SEGMENTS = ("pinned", "shared", "private", "cached", "free")
FLASH_S = 1.0


def segments(stats: EngineStats) -> dict[str, int]:
    """Block counts per segment (see the module docstring); they sum to ``stats.num_blocks``."""
    return stats.segments


def cells(counts: dict[str, int], width: int) -> dict[str, int]:
    """Split ``width`` cells in proportion to ``counts`` (cumulative rounding: no drift)."""
    total = sum(counts.values()) or 1
    out: dict[str, int] = {}
    done = acc = 0
    for name, count in counts.items():
        acc += count
        edge = round(acc * width / total)
        out[name] = edge - done
        done = edge
    return out


class BlockGauge(Widget):
    """Pool bar, numbers, and the engine's status line; polled by the app."""

    COMPONENT_CLASSES = {f"block-gauge--{name}" for name in SEGMENTS} | {
        "block-gauge--label",
        "block-gauge--swap",
        "block-gauge--status",
        "block-gauge--warning",
    }

    stats: reactive[EngineStats | RemoteStats | None] = reactive(None)
    status: reactive[str] = reactive("starting the engine…")
    saving: reactive[str] = reactive("")
    """Shown after the status when chats are not being saved ("not saving: ...")."""
    preemptions: reactive[int] = reactive(0)

    @property
    def pool(self) -> EngineStats | None:
        """The block pool shown: the local engine's, or a chatpage serve backend's."""
        stats = self.stats
        return stats.engine if isinstance(stats, RemoteStats) else stats

    @property
    def segments(self) -> dict[str, int] | None:
        return segments(self.pool) if self.pool is not None else None

    def watch_stats(
        self, old: EngineStats | RemoteStats | None, new: EngineStats | RemoteStats | None
    ) -> None:
        if new is None:
            return
        if isinstance(new, RemoteStats):
            total = new.preemptions or 0
        else:
            total = new.preemptions_recompute + new.preemptions_swap
        if old is not None and total > self.preemptions:
            self.add_class("-preempted")
            self.set_timer(FLASH_S, lambda: self.remove_class("-preempted"))
        self.preemptions = total

    def _style(self, name: str):
        return self.get_component_rich_style(f"block-gauge--{name}", partial=True)

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" " + clean(self.status), self._style("status"))
        if self.saving:
            text.append(f"  │  {clean(self.saving)}", self._style("warning"))
        if isinstance(self.stats, RemoteStats):
            self._render_remote(text, self.stats)
        stats = self.pool
        if stats is None:
            return text
        counts = segments(stats)
        size = stats.bytes_per_block
        summary = (
            f"  {stats.blocks_used}/{stats.num_blocks} blocks · "
            f"{format_size(stats.blocks_used * size)} of "
            f"{format_size(stats.num_blocks * size)}"
        )
        label = f" KV {clean(stats.device)} "  # the pool lives there (the GPU's on a GPU)
        width = max(10, self.size.width - len(summary) - len(label) - 1)
        text.append("\n" + label, self._style("label"))
        for name, n in cells(counts, width).items():
            text.append(" " * n, self._style(name))
        text.append(summary)
        text.append("\n ")
        for name in SEGMENTS:
            text.append("  ", self._style(name))
            text.append(f" {name} {counts[name]}  ")
        text.append("│ swap ", self._style("swap"))
        text.append(f"{stats.blocks_swapped}/{stats.num_cpu_blocks} CPU blocks")
        if stats.disk_capacity:
            text.append(" │ disk ", self._style("label"))
            text.append(
                f"{stats.disk_blocks} blocks · {format_size(stats.disk_bytes)} of "
                f"{format_size(stats.disk_capacity)} · hits {stats.disk_hit_tokens} tokens"
            )
        rate = f"{stats.tokens_per_s:.1f} tok/s" if stats.num_running else "idle"  # not the last
        text.append(
            f"\n {rate} │ running {stats.num_running} · "
            f"waiting {stats.num_waiting} · swapped {stats.num_swapped} │ preempted "
            f"{stats.preemptions_recompute} recompute · {stats.preemptions_swap} swap │ "
            f"prefix hits {stats.prefix_hit_tokens} tokens │ {stats.device} · kernels "
            f"{stats.kernels}"
        )
        return text

    def _render_remote(self, text: Text, r: RemoteStats) -> None:
        def shown(value, fmt: str) -> str:
            return "—" if value is None else format(value, fmt)

        text.append(f"\n {clean(r.backend)} ", self._style("label"))
        if not r.reachable:
            text.append(" unreachable", self._style("warning"))
        else:
            usage = None if r.kv_usage is None else 100 * r.kv_usage
            hits = None if r.prefix_hit_rate is None else 100 * r.prefix_hit_rate
            text.append(
                f" KV {shown(usage, '.0f')}% │ running {shown(r.num_running, 'd')} · "
                f"waiting {shown(r.num_waiting, 'd')} │ prefix hits {shown(hits, '.0f')}% "
                f"│ {shown(r.tokens_per_s, '.1f')} tok/s │ preempted "
                f"{shown(r.preemptions, 'd')}"
            )
        for note in r.notes:
            text.append(f"  │  {clean(note)}", self._style("warning"))
