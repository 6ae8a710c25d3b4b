"""The alerts package's Prometheus metrics (default registry, shared with logstream.metrics).

Labels stay low-cardinality: the channel *kind*, never a receiver name or URL.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ALERTS_SENT = Counter(
    "logstream_alerts_sent_total",
    "Delivery attempts by channel kind and outcome (delivered, retry, dead, deferred).",
    ["channel", "outcome"],
)
OUTBOX_PENDING = Gauge("logstream_alerts_outbox_pending", "Deliveries waiting in the outbox.")
WORKER_UP = Gauge(
    "logstream_delivery_worker_up",
    "1 while the alert delivery worker loop runs, 0 while it is restarting after an error or stopped.",
)
WORKER_RESTARTS = Counter(
    "logstream_delivery_worker_restarts_total",
    "Times the delivery worker loop failed with an error and was restarted.",
)
OUTBOX_PRUNED = Counter(
    "logstream_alerts_outbox_pruned_total",
    "Outbox rows removed after their retention period, by kind: delivered, dead (letters), resolved (groups).",
    ["kind"],
)
NOTIFICATION_LATENCY = Histogram(
    "logstream_alert_notification_latency_seconds",
    "From a notification being made (its group timer fired) to the receiver's 2xx, by channel kind:"
    " queueing, retries, rate limits and the request itself.",
    ["channel"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
)
