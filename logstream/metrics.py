"""Prometheus metrics (names as in DESIGN "Interfaces"), the /healthz /readyz /metrics server,
and the bounded HTTP server it and POST /feedback (logstream.http_api) run on.

Defined once here, in the default registry, so that every module counts into
the same series. Labels stay low-cardinality: never a stream id or free text.
(`logstream_alerts_sent_total{channel,outcome}` belongs to the alerts package.)

Both servers are bounded (`HttpLimits`): a socket read waits at most `timeout_seconds`, and
at most `max_connections` requests are handled at once; a connection beyond the cap is
answered 503 and closed, so clients that open connections and never finish a request hold
a bounded number of threads, not one each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

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
# state that follows its partition (logstream/kafka_state.py) and affinity (consumers/repartition.py)
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
CHANGELOG_RESTORE_FAILURES = Counter(
    "logstream_changelog_restore_failures",
    "Streams that started cold because their changelog state could not be restored, by reason"
    " (undecodable, token_ids, offset, rebuild: one per stream; read: one per unreadable restore).",
    ["reason"],
)
for _reason in ("undecodable", "token_ids", "offset", "rebuild", "read"):
    CHANGELOG_RESTORE_FAILURES.labels(reason=_reason)  # every reason exported from the start, at 0
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
FEEDBACK_RULES = Gauge("logstream_feedback_rules", "Operator rules in force, by verdict.", ["verdict"])
FEEDBACK_REFRESH_ERRORS = Counter(
    "logstream_feedback_refresh_errors",
    "Reads of the feedback database that failed (the rules read before stay in force), by SQLite error class.",
    ["kind"],
)
HTTP_REFUSED = Counter(
    "logstream_http_refused_connections",
    "Connections answered 503 at once: the server already handled http.max_connections.",
    ["server"],
)
FEEDBACK_SUPPRESSED = Counter(
    "logstream_feedback_suppressed_lines",
    "Lines over the threshold that did not alert: an operator marked their template normal.",
)
MODEL_RELOADS = Counter(
    "logstream_model_reloads", "Hot reloads of the model store's live version (promote or rollback)."
)
MODEL_LOAD_FAILURES = Counter(
    "logstream_model_load_failures",
    "Store versions that failed to load or to score a trial line (serve kept the model it had).",
)
MODEL_FALLBACK = Gauge(
    "logstream_model_fallback",
    "1 while serve scores with another version than the store's live one, which does not load.",
)
SHADOW_FAILURES = Counter(
    "logstream_shadow_failures",
    "Shadow models dropped, by stage (load, score): the live model goes on scoring.",
    ["stage"],
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
    pipeline's delivery worker is up); `fetching` asks the consumer whether it fetched
    lately, if it holds partitions. Both are called on every probe.
    """

    alive: bool = True
    model_loaded: bool = False
    partitions_assigned: bool = False
    scoring: bool = True  # False once the scorer loop has ended for any reason
    sink_healthy: Callable[[], bool] = _always
    fetching: Callable[[], bool] = _always

    @property
    def healthy(self) -> bool:
        """Up, past model loading, scoring, the sink delivering, and partitions it holds being
        fetched. Never asks the broker: a broker outage still completes (empty) fetches."""
        return (
            self.alive
            and self.model_loaded
            and self.scoring
            and _says(self.sink_healthy)
            and _says(self.fetching)
        )

    @property
    def ready(self) -> bool:
        return self.healthy and self.partitions_assigned


def _says(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # a probe must answer; a part that cannot say is not healthy
        return False


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes hit these endpoints every few seconds: no access log."""


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\nbusy\n"
)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold: each socket read waits at most `timeout_seconds`, and at
    most `max_connections` requests are handled at once (a thread each); a connection
    beyond is answered 503 and closed at once, never queued."""

    timeout_seconds: float = 10.0
    max_connections: int = 16


class BoundedWSGIServer(WSGIServer):
    """wsgiref's server with a thread per request, at most `limits.max_connections` of them.

    The accepting thread takes a slot before it starts a request's thread, so the count
    can never pass the cap: a client that opens connections and sends nothing (or half a
    request) holds at most that many threads, each for `timeout_seconds` per read."""

    def __init__(self, address: tuple[str, int], app: WsgiApp, name: str, limits: HttpLimits) -> None:
        handler = type("_Handler", (_QuietHandler,), {"timeout": limits.timeout_seconds})
        super().__init__(address, handler)
        self.set_app(app)
        self.name = name
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._active = 0
        self._active_lock = threading.Lock()

    @property
    def active(self) -> int:
        """Requests being handled now (each on a thread of its own)."""
        return self._active

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            HTTP_REFUSED.labels(server=self.name).inc()
            try:
                request.settimeout(1.0)  # a few bytes into a fresh socket's buffer: never blocks long
                request.sendall(_BUSY)
            except OSError:
                pass  # the client left already
            self.shutdown_request(request)
            return
        with self._active_lock:
            self._active += 1
        threading.Thread(
            target=self._handle,
            args=(request, client_address),
            name=f"logstream-{self.name}-request",
            daemon=True,
        ).start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # a client that timed out, reset or left: nothing to answer
        except Exception:
            self.handle_error(request, client_address)  # a bug: its traceback on stderr
        finally:
            self.shutdown_request(request)
            with self._active_lock:
                self._active -= 1
            self._slots.release()


def start_server(host: str, port: int, app: WsgiApp, name: str, limits: HttpLimits) -> BoundedWSGIServer:
    """Serve `app` from a daemon thread (`name`: `metrics` or `feedback`, for logs and
    metrics); `shutdown()` stops it. OSError if the address cannot be bound."""
    server = BoundedWSGIServer((host, port), app, name, limits)
    threading.Thread(target=server.serve_forever, name=f"logstream-{name}", daemon=True).start()
    return server


def serve_http(host: str, port: int, health: Health, limits: HttpLimits | None = None) -> BoundedWSGIServer:
    """Serve /healthz, /readyz and /metrics from a daemon thread; `shutdown()` stops it."""
    metrics_app = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        checks = {"/healthz": health.healthy, "/readyz": health.ready}
        if path not in checks:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        ok = checks[path]
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"not ready\n"]

    return start_server(host, port, app, "metrics", limits or HttpLimits())
