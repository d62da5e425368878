"""A remote server's gauge figures: its ``/metrics`` read under each backend's names.

vLLM: ``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``), running/waiting
requests, preemptions, prefix-cache hits over queries, generated tokens. SGLang:
``sglang:token_usage``, ``sglang:cache_hit_rate``, ``sglang:num_running_reqs``,
``sglang:num_queue_reqs``, ``sglang:gen_throughput``. llama-server: ``llamacpp:*``. chatpage serve
speaks vLLM's names, and its whole block pool comes from ``/v1/chatpage/stats``.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Any

from chatpage.engine.outputs import EngineStats

# figure -> the metric names that carry it, first found wins (counters without _total)
NAMES: dict[str, tuple[str, ...]] = {
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "preemptions": ("vllm:num_preemptions",),
    "hit_rate": ("sglang:cache_hit_rate",),
    "prefix_hits": ("vllm:prefix_cache_hits",),
    "prefix_queries": ("vllm:prefix_cache_queries",),
    "generated": ("vllm:generation_tokens", "llamacpp:tokens_predicted"),
    "throughput": ("sglang:gen_throughput", "llamacpp:predicted_tokens_seconds"),
}


@dataclass(frozen=True)
class RemoteStats:
    """What the gauge shows for a remote backend; None = the backend does not say."""

    backend: str  # label, e.g. "vLLM 0.9.1 at http://gpu:8000"
    reachable: bool
    kv_usage: float | None = None  # 0..1
    num_running: int | None = None
    num_waiting: int | None = None
    prefix_hit_rate: float | None = None
    preemptions: int | None = None
    tokens_per_s: float | None = None
    engine: EngineStats | None = None  # chatpage serve: its block pool
    notes: tuple[str, ...] = ()


def read_metrics(text: str) -> dict[str, float]:
    """Sum each metric's samples (over labels) by family name; keeps the names in NAMES."""
    from prometheus_client.parser import text_string_to_metric_families  # the serve extra

    wanted = {n for names in NAMES.values() for n in names}
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name not in wanted:
                continue
            samples = [s for s in family.samples if s.name in (family.name, family.name + "_total")]
            if samples:
                values[family.name] = sum(s.value for s in samples)
    except ValueError:  # not Prometheus text after all: keep what was read
        pass
    return values


def figures(values: dict[str, float]) -> dict[str, float]:
    """The first name found for each figure in NAMES."""
    out = {}
    for figure, names in NAMES.items():
        found = next((values[n] for n in names if n in values), None)
        if found is not None:
            out[figure] = found
    return out


class Poller:
    """Turns successive /metrics scrapes into `RemoteStats` (rates from counter deltas)."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None  # (time, generated tokens)

    def stats(
        self,
        backend: str,
        text: str | None,
        now: float,
        engine: EngineStats | None,
        notes: tuple[str, ...],
    ) -> RemoteStats:
        values = read_metrics(text) if text else {}
        bad = [name for name, value in values.items() if not 0 <= value < math.inf]  # NaN too
        if bad:
            shown = ", ".join(f"{name} = {values[name]}" for name in sorted(bad))
            notes = (
                *notes,
                f"{backend}'s /metrics says {shown}: not a figure the gauge can show; ignored",
            )
        f = figures({name: value for name, value in values.items() if name not in bad})
        rate = f.get("throughput")
        if rate is None and "generated" in f:
            if self._last is not None and now > self._last[0]:
                rate = max(0.0, (f["generated"] - self._last[1]) / (now - self._last[0]))
            self._last = (now, f["generated"])
        hit = f.get("hit_rate")
        if hit is None and f.get("prefix_queries"):
            hit = f.get("prefix_hits", 0.0) / f["prefix_queries"]
        usage = f.get("kv_usage")

        def count(name: str) -> int | None:
            return int(f[name]) if name in f else None

        return RemoteStats(
            backend,
            True,
            None if usage is None else min(usage, 1.0),
            count("running"),
            count("waiting"),
            None if hit is None else min(hit, 1.0),
            count("preemptions"),
            rate,
            engine,
            notes,
        )


def engine_stats(data: object) -> EngineStats | None:
    """chatpage serve's block pool from its ``/v1/chatpage/stats`` JSON; None unless every
    figure is there and is a number the gauge can show."""
    if not isinstance(data, dict):
        return None
    values: dict[str, Any] = {}
    for info in fields(EngineStats):
        value = data.get(info.name, info.default)
        if info.name in ("kernels", "device"):
            ok = isinstance(value, str)
        elif info.name == "tokens_per_s":
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and 0 <= value < math.inf
            )
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if value is MISSING or not ok:
            return None
        values[info.name] = value
    return EngineStats(**values)
