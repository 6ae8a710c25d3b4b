"""What the alert pipeline keeps in the incident memory, and what it asks of it.

`IncidentRecorder` is the outbox's `IncidentLog` (logstream.alerts.outbox):

- `changed(groups)`: groups the outbox just committed (opened or grown by a `put`, or
  changed state in a flush, so closed incidents are evicted first) are recorded; a group's
  new distinct lines are queued to be embedded, while its incident holds fewer than
  MAX_EMBEDDED;
- `past(fingerprints)`: the past incidents most like each incident, as its alert carries
  them (`PastIncident.to_json`), the verdicts read once for all of them;
- `prune()`: incidents not seen for the retention period go, when the outbox prunes.

The memory is what an alert carries besides its own facts, so its failures never reach
the pipeline: a memory that is locked, full or damaged leaves alerts without past
incidents and the anomalies in the outbox, logs the error once per operation until that
operation works again, and counts it (`logstream_incident_memory_errors_total{operation}`).

Embeddings come from the detector's own model (`LineEmbedder`: each line alone after the
model's sinks) on a thread of its own, off the scoring thread. At most QUEUE_LINES lines
wait; past that a line is dropped (counted): its incident keeps the lines it has, and
its words still compare. Lines still queued when the sink closes are dropped the same way.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from logstream.memory.metrics import (
    INCIDENT_EMBEDDINGS,
    INCIDENT_LOOKUP_SECONDS,
    INCIDENT_MEMORY_ERRORS,
    INCIDENTS,
)
from logstream.memory.retrieval import IncidentMemory
from logstream.memory.store import MAX_EMBEDDED, observed

if TYPE_CHECKING:
    from logstream.alerts.grouping import Group
    from logstream.detector import Detector
    from logstream.memory.embedding import LineEmbedder
    from logstream.records import Anomaly

log = structlog.get_logger(__name__)

QUEUE_LINES = 256  # lines waiting to be embedded (a storm of new incidents drops the rest)
EMBED_STREAMS = 4  # the embedder's ring slots: it embeds a few lines at a time
POLL_SECONDS = 0.2  # how often the waiting embedder looks at the stop flag


class IncidentRecorder:
    """The incident memory as the alert pipeline uses it (see the module doc)."""

    def __init__(self, memory: IncidentMemory) -> None:
        self.memory = memory
        self.embeddings: EmbeddingQueue | None = None
        self._failing: set[str] = set()  # operations failing since their last success
        INCIDENTS.set(len(memory.index))

    def embed_with(self, model: Callable[[], Detector | None]) -> None:
        """Embed new incidents' lines with the model `model()` returns at the time (serve's
        and tail's detector, which a promote may replace)."""
        if self.embeddings is None:
            self.embeddings = EmbeddingQueue(self, model)
        else:
            self.embeddings.model = model

    def changed(self, groups: Sequence[tuple[Group, Sequence[Anomaly]]]) -> None:
        """Record committed groups, each with the anomalies that were new distinct alerts in it."""
        for group, fresh in groups:
            try:
                incident = self.memory.record(observed(group, *fresh))
            except Exception as exc:  # the memory must never stop the pipeline (module doc)
                self.failed("record", exc)
                continue
            self.worked("record")
            room = MAX_EMBEDDED - incident.embedded
            if self.embeddings is not None and room > 0 and fresh:
                self.embeddings.submit(incident.fingerprint, [a.line for a in fresh[:room]])
        INCIDENTS.set(len(self.memory.index))

    def past(self, fingerprints: Sequence[str]) -> list[tuple[dict[str, Any], ...]]:
        """For each incident (an alert's fingerprint), the past incidents most like it, best
        first (none when the lookup fails)."""
        started = time.perf_counter()
        try:
            feedback = self.memory.store.verdicts()
            found = [tuple(p.to_json() for p in self.memory.similar(f, feedback)) for f in fingerprints]
        except Exception as exc:  # an alert goes out without them rather than not at all
            self.failed("lookup", exc)
            return [() for _ in fingerprints]
        self.worked("lookup")
        if fingerprints:
            INCIDENT_LOOKUP_SECONDS.observe((time.perf_counter() - started) / len(fingerprints))
        return found

    def prune(self) -> None:
        """Delete the incidents not seen for the retention period."""
        try:
            gone = self.memory.prune()
        except Exception as exc:
            self.failed("prune", exc)
            return
        self.worked("prune")
        INCIDENTS.set(len(self.memory.index))
        if gone:
            log.info("incidents_pruned", incidents=gone, retention_seconds=self.memory.settings.retention)

    def failed(self, operation: str, exc: Exception) -> None:
        INCIDENT_MEMORY_ERRORS.labels(operation=operation).inc()
        if operation not in self._failing:
            self._failing.add(operation)
            log.error("incident_memory_failed", operation=operation, error=str(exc) or repr(exc))

    def worked(self, operation: str) -> None:
        if operation in self._failing:
            self._failing.discard(operation)
            log.info("incident_memory_recovered", operation=operation)

    def close(self) -> None:
        if self.embeddings is not None:
            self.embeddings.close()
        self.memory.close()


class EmbeddingQueue:
    """Embeds incidents' new lines on a thread of its own, with the model `model()` returns
    (a `LineEmbedder` made for it, made again when the model changes)."""

    def __init__(
        self, recorder: IncidentRecorder, model: Callable[[], Detector | None], capacity: int = QUEUE_LINES
    ) -> None:
        self.recorder = recorder
        self.model = model
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(capacity)
        self._stop = threading.Event()
        self._embedder: tuple[str, LineEmbedder] | None = None  # (model id, its embedder)
        self._thread = threading.Thread(target=self._run, name="logstream-incident-embed", daemon=True)
        self._thread.start()

    def submit(self, fingerprint: str, lines: Sequence[str]) -> None:
        """Queue lines of an incident; never waits (a full queue drops them, counted)."""
        for line in lines:
            try:
                self._queue.put_nowait((fingerprint, line))
            except queue.Full:
                INCIDENT_EMBEDDINGS.labels(outcome="dropped").inc()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fingerprint, line = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            try:
                self._embed(fingerprint, line)
            except Exception as exc:  # a model that fails here must not stop the thread
                self.recorder.failed("embed", exc)
            else:
                self.recorder.worked("embed")

    def _embed(self, fingerprint: str, line: str) -> None:
        detector = self.model()
        if detector is None:
            return
        if self._embedder is None or self._embedder[0] != detector.model_id:
            from logstream.memory.embedding import LineEmbedder  # torch: only where a model runs

            engine = detector.engine
            embedder = LineEmbedder(
                engine.model, detector.tokenizer, detector.meta,
                device=engine.device, dtype=engine.dtype, max_streams=EMBED_STREAMS,
            )  # fmt: skip
            self._embedder = (detector.model_id, embedder)
        self.recorder.memory.embedded(fingerprint, self._embedder[1].embed_incident([line]))
        INCIDENT_EMBEDDINGS.labels(outcome="embedded").inc()

    def pending(self) -> int:
        """Lines queued and not yet taken."""
        return self._queue.qsize()

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the line being embedded; lines still queued are dropped (counted)."""
        self._stop.set()
        self._thread.join(timeout)
        INCIDENT_EMBEDDINGS.labels(outcome="dropped").inc(self._queue.qsize())
