"""Prometheus metrics of the scoring path and the sources (names as in DESIGN "Interfaces").

Defined once here, in the default registry, so that every module counts into
the same series. Labels stay low-cardinality: never a stream id or free text.
(`logstream_alerts_sent_total{channel,outcome}` belongs to the alerts package.)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LINES = Counter("logstream_lines", "Log lines scored.")
ANOMALIES = Counter("logstream_anomalies", "Anomalies handed to the sink.", ["kind", "severity"])
SCORE_SECONDS = Histogram(
    "logstream_score_seconds",
    "Time to score one batch of lines.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
CACHE_BYTES = Gauge("logstream_cache_bytes", "Bytes held by the streams' KV caches.")
BAD_RECORDS = Counter("logstream_bad_records", "Messages skipped as bad input.", ["kind"])
DEAD_LETTERS = Counter("logstream_dead_letters", "Bad messages copied to the dead-letter topic.")
CONSUMER_LAG = Gauge(
    "logstream_consumer_lag",
    "Messages behind the partition's high watermark.",
    ["topic", "partition"],
)
COMMITS = Counter("logstream_commits", "Offset commits to Kafka.", ["outcome"])
INFLIGHT_LINES = Gauge("logstream_inflight_lines", "Lines fetched and not yet committed.")
PAUSED_PARTITIONS = Gauge("logstream_paused_partitions", "Partitions paused for backpressure.")
ASSIGNED_PARTITIONS = Gauge("logstream_assigned_partitions", "Partitions this consumer owns.")
