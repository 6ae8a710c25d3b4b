"""The incident memory's Prometheus metrics (default registry, shared with logstream.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INCIDENTS = Gauge(
    "logstream_incidents", "Incidents kept in the incident memory (as this process indexes them)."
)
INCIDENT_MEMORY_ERRORS = Counter(
    "logstream_incident_memory_errors",
    "Incident memory operations that failed (the alert still went out, without what failed):"
    " record, lookup, embed, prune.",
    ["operation"],
)
INCIDENT_EMBEDDINGS = Counter(
    "logstream_incident_embeddings",
    "Alert lines for incidents' vectors, by outcome: embedded, dropped (the queue was full).",
    ["outcome"],
)
INCIDENT_LOOKUP_SECONDS = Histogram(
    "logstream_incident_lookup_seconds",
    "Time to find the past incidents like one new incident, verdicts included.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
