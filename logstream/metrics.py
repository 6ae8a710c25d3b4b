"""Prometheus metrics (names as in DESIGN "Interfaces") and the /healthz /readyz /metrics server.

Defined once here, in the default registry, so that every module counts into
the same series. Labels stay low-cardinality: never a stream id or free text.
(`logstream_alerts_sent_total{channel,outcome}` belongs to the alerts package.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

LINES = Counter("logstream_lines", "Log lines scored.")
ANOMALIES = Counter("logstream_anomalies", "Anomalies handed to the sink.", ["kind", "severity"])
SCORE_SECONDS = Histogram(
    "logstream_score_seconds",
    "Time to score one batch of lines.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
CACHE_BYTES = Gauge("logstream_cache_bytes", "Bytes held by the streams' KV caches.")
BAD_RECORDS = Counter("logstream_bad_records", "Messages skipped as bad input.", ["kind"])
MULTILINE_CUT = Counter(
    "logstream_multiline_cut",
    "Multi-line events cut at input.multiline max_lines or max_bytes (the rest became another event).",
)
DEAD_LETTERS = Counter("logstream_dead_letters", "Bad messages copied to the dead-letter topic.")
DEAD_LETTER_FAILURES = Counter(
    "logstream_dead_letter_failures",
    "Dead-letter copies that failed; the partition waits at that message and retries.",
)
CONSUMER_LAG = Gauge(
    "logstream_consumer_lag",
    "Messages behind the partition's high watermark.",
    ["topic", "partition"],
)
COMMITS = Counter("logstream_commits", "Offset commits to Kafka.", ["outcome"])
INFLIGHT_LINES = Gauge("logstream_inflight_lines", "Lines fetched and not yet committed.")
PAUSED_PARTITIONS = Gauge("logstream_paused_partitions", "Partitions paused for backpressure.")
ASSIGNED_PARTITIONS = Gauge("logstream_assigned_partitions", "Partitions this consumer owns.")
TRACKED_STREAMS = Gauge("logstream_tracked_streams", "Streams tracked for the idle timeout.")
QUIET_WATCHED = Gauge(
    "logstream_quiet_watched_sources", "(stream, source) pairs whose rhythm the quiet-source watch keeps."
)
TEMPLATES = Gauge(
    "logstream_templates", "Log templates the miner holds (least recently used beyond its cap are forgotten)."
)
LINE_SCORE = Histogram(
    "logstream_line_score",
    "Calibrated scores of scored lines, in -log10 p (a line alerts above logstream_threshold).",
    buckets=(0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0),
)
THRESHOLD = Gauge(
    "logstream_threshold", "The line threshold in -log10 p (a line scoring above it is an anomaly)."
)
ACTIVE_STREAMS = Gauge("logstream_active_streams", "Streams holding a KV cache in the engine now.")
BUILD_INFO = Gauge(
    "logstream_build_info",
    "Always 1; the labels say which logstream and which model run.",
    ["version", "model_id"],
)
TRACKED_STREAM_EVICTIONS = Counter(
    "logstream_tracked_stream_evictions",
    "Streams forgotten by the idle tracker at max_tracked_streams (least recently seen first).",
)
# state that follows its partition (logstream/changelog.py) and affinity (consumers/repartition.py)
CHANGELOG_WRITES = Counter(
    "logstream_changelog_writes", "Stream states written to the changelog topic.", ["outcome"]
)
RESTORE_SECONDS = Histogram(
    "logstream_restore_seconds",
    "Time to restore assigned partitions' streams from the changelog (read + re-encode).",
    buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
RESTORED_STREAMS = Counter("logstream_restored_streams", "Streams restored from the changelog.")
CHANGELOG_SKIPPED_LINES = Counter(
    "logstream_changelog_skipped_lines",
    "Re-delivered lines skipped: a restored state already covered them (scored, handed off).",
)
COLD_LINES = Counter(
    "logstream_cold_start_suppressed",
    "Anomalies held back by the cold-start policy (the stream had too little context).",
)
SPLIT_STREAMS = Counter(
    "logstream_split_streams",
    "Streams seen on more than one partition (their context is split: repartition or key by stream).",
)
REPARTITIONED = Counter("logstream_repartitioned", "Messages forwarded by the repartition stage.")
FEEDBACK = Counter(
    "logstream_feedback", "POST /feedback requests by verdict and outcome.", ["verdict", "outcome"]
)
FEEDBACK_SUPPRESSED = Counter(
    "logstream_feedback_suppressed_lines",
    "Lines over the threshold that did not alert: an operator marked their template normal.",
)
MODEL_RELOADS = Counter(
    "logstream_model_reloads", "Hot reloads of the model store's live version (promote or rollback)."
)
MODEL_FLAGGED = Counter(
    "logstream_model_flagged_lines", "Lines over the threshold, per model role (live, shadow).", ["role"]
)
MODEL_WOULD_ALERT = Counter(
    "logstream_model_would_alert",
    "Distinct (stream, template) flagged per batch, per model role: alerts before grouping timers.",
    ["role"],
)
CANDIDATES = Counter(
    "logstream_candidates", "Scheduled candidate versions trained by serve, by outcome.", ["outcome"]
)
SHADOW_OVERLAP = Counter(
    "logstream_shadow_overlap_lines", "Lines flagged by both the live and the shadow model."
)


def _always() -> bool:
    return True


@dataclass
class Health:
    """What /healthz and /readyz report; the service flips these flags.

    `sink_healthy` asks the anomaly sink whether it still delivers (the alert
    pipeline's delivery worker is up); it is called on every probe.
    """

    alive: bool = True
    model_loaded: bool = False
    partitions_assigned: bool = False
    scoring: bool = True  # False once the scorer loop has ended for any reason
    sink_healthy: Callable[[], bool] = _always

    @property
    def healthy(self) -> bool:
        """Up, past model loading, scoring, and the sink delivering. Never looks at Kafka."""
        return self.alive and self.model_loaded and self.scoring and self._sink_ok()

    def _sink_ok(self) -> bool:
        try:
            return bool(self.sink_healthy())
        except Exception:  # a probe must answer; a sink that cannot say is not healthy
            return False

    @property
    def ready(self) -> bool:
        return self.healthy and self.partitions_assigned


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes hit these endpoints every few seconds: no access log."""


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serve_http(
    host: str, port: int, health: Health, routes: Mapping[str, WsgiApp] | None = None
) -> WSGIServer:
    """Serve /healthz, /readyz, /metrics and `routes` (e.g. /feedback) from a daemon thread;
    `shutdown()` stops it."""
    metrics_app = make_wsgi_app()
    routes = dict(routes or {})

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in routes:
            return routes[path](environ, start_response)
        checks = {"/healthz": health.healthy, "/readyz": health.ready}
        if path not in checks:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        ok = checks[path]
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"not ready\n"]

    server = make_server(host, port, app, _ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="logstream-http", daemon=True).start()
    return server
