"""Prometheus metrics (`GET /metrics`), one registry per app.

Counters and histograms are updated as requests run; the engine's gauges (running /
waiting sequences, cache blocks, prefix-cache hit rate, preemptions) are read from the
engine loop's latest stats snapshot at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# engine stats key -> help; present only when the engine runs with a KV store (--kv-store)
STORE_COUNTERS = {
    "store_hits": "KV store blocks read back instead of prefilled",
    "store_misses": "KV store lookups that found no usable block",
    "store_bytes_read": "bytes read from the KV store",
    "store_bytes_written": "bytes written to the KV store",
    "store_write_drops": "blocks not written to the KV store (queue full or store unwritable)",
    "store_corrupt_blocks": "KV store files that failed their checksum (skipped and removed)",
    "store_evicted_blocks": "KV store files evicted to keep the size bound",
}


class EngineStatsCollector:
    """Gauges and counters taken from `stats()` of the engine (via a callable)."""

    def __init__(self, read_stats):
        self.read_stats = read_stats

    def collect(self):
        s = self.read_stats()
        gauges = {
            "latentkv_num_requests_running": ("sequences running now", s["running"]),
            "latentkv_num_requests_waiting": ("sequences waiting for a slot or cache blocks", s["waiting"]),
            "latentkv_cache_blocks_used": ("latent cache blocks in use", s["blocks_used"]),
            "latentkv_cache_blocks_free": (
                "latent cache blocks free (cached prefixes count as free)",
                s["blocks_free"],
            ),
            "latentkv_cache_capacity_tokens": ("tokens the latent cache holds", s["capacity_tokens"]),
            "latentkv_prefix_cache_hit_rate": (
                "prefix-cache hits / queries (full blocks)",
                s["prefix_hits"] / s["prefix_queries"] if s["prefix_queries"] else 0.0,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "latentkv_prefix_cache_queries": ("prefix-cache block lookups", s["prefix_queries"]),
            "latentkv_prefix_cache_hits": ("prefix-cache block hits", s["prefix_hits"]),
            "latentkv_num_preemptions": ("sequences preempted for lack of cache blocks", s["preemptions"]),
        }
        counters.update({f"latentkv_{key}": (doc, s[key]) for key, doc in STORE_COUNTERS.items() if key in s})
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, read_stats):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("latentkv_requests", "HTTP API requests by status code", ["status"], registry=r)
        self.finished = Counter("latentkv_request_finish", "finished generations by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter("latentkv_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("latentkv_generation_tokens", "generated tokens", registry=r)
        self.ttft = Histogram(
            "latentkv_time_to_first_token_seconds",
            "arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "latentkv_inter_token_latency_seconds",
            "time between a request's outputs",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(EngineStatsCollector(read_stats))

    def count_status(self, status: int) -> None:
        self.requests.labels(status=str(status)).inc()

    def count_finished(self, out) -> None:
        """Called by the engine loop once per finished request."""
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        for c in out.outputs:
            self.generation_tokens.inc(len(c.token_ids))
            self.finished.labels(reason=c.finish_reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
