"""The alerts package's Prometheus metrics (default registry, shared with logstream.metrics).

Labels stay low-cardinality: the channel *kind*, never a receiver name or URL.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
    "Outbox rows removed after their retention period, by kind (delivered, dead).",
    ["kind"],
)
