"""``GET /metrics``: the engine's numbers in Prometheus text, under vLLM's names where they mean
the same, plus ``chatpage:`` gauges for the block pool's segments.

Gauges are read from the latest `EngineStats` at scrape time; token and request counters are
counted by the server as its requests finish.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from chatpage.engine.outputs import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BLOCK_GAUGES = {
    "pinned": "persona prefix blocks pinned for every chat",
    "shared": "unpinned blocks read by more than one sequence",
    "private": "blocks one sequence holds alone",
    "cached": "unreferenced blocks still indexed by hash (reusable)",
    "free": "blocks never used or evicted",
    "swapped": "blocks in use in the CPU swap pool",
}


class ServerCounters:
    """What the server counts itself: prompt and generated tokens, finished requests."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()

    def record(self, prompt_tokens: int, generation_tokens: int, finish_reason: str) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        self.finished[finish_reason] += 1


class EngineCollector:
    """A prometheus_client collector over a stats source and the server's counters."""

    def __init__(
        self,
        stats: Callable[[], EngineStats | None],
        counters: ServerCounters,
        model_name: Callable[[], str],
    ) -> None:
        self._stats = stats
        self._counters = counters
        self._model = model_name

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self._model()], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self._model()], value)
        return c

    def collect(self) -> Iterator[Metric]:
        counters = self._counters
        yield self._counter("vllm:prompt_tokens", "Prompt tokens processed", counters.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Generated tokens", counters.generation_tokens
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            counters.prompt_tokens,
        )
        done = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by reason",
            labels=["model_name", "finished_reason"],
        )
        for reason, count in sorted(counters.finished.items()):
            done.add_metric([self._model(), reason], count)
        yield done
        stats = self._stats()
        if stats is None:
            return
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "KV cache usage (1 = full)",
            stats.blocks_used / stats.num_blocks if stats.num_blocks else 0.0,
        )
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the running batch", stats.num_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled",
            stats.num_waiting + stats.num_swapped,
        )
        yield self._counter(
            "vllm:num_preemptions",
            "Preemptions (recompute and swap)",
            stats.preemptions_recompute + stats.preemptions_swap,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens served from the prefix cache",
            stats.prefix_hit_tokens,
        )
        yield self._counter(
            "chatpage:prefix_cache_hits_device",
            "Prompt tokens served from blocks on the device",
            stats.prefix_hit_tokens - stats.disk_hit_tokens,
        )
        yield self._counter(
            "chatpage:prefix_cache_hits_disk",
            "Prompt tokens served from blocks read from the KV disk tier",
            stats.disk_hit_tokens,
        )
        yield self._counter(
            "chatpage:kv_disk_writes", "Blocks written to the KV disk tier", stats.disk_writes
        )
        yield self._gauge(
            "chatpage:kv_disk_bytes", "Bytes in the KV disk tier's folder", stats.disk_bytes
        )
        # speculative decoding, as vLLM v1 names it
        yield self._counter(
            "vllm:spec_decode_num_drafts", "Speculative verifications", stats.spec_drafts
        )
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens", "Tokens drafted", stats.spec_draft_tokens
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Drafted tokens accepted",
            stats.spec_accepted_tokens,
        )
        values = {**stats.segments, "swapped": stats.blocks_swapped}
        for name, doc in BLOCK_GAUGES.items():
            yield self._gauge(f"chatpage:blocks_{name}", doc.capitalize(), values[name])
        yield self._gauge("chatpage:num_blocks", "Blocks in the device pool", stats.num_blocks)
        yield self._gauge(
            "chatpage:tokens_per_s", "Generated tokens per second (last 3 s)", stats.tokens_per_s
        )


def registry(collector: EngineCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
