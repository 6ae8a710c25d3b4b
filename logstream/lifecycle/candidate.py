"""Scheduled candidates: serve trains the next model version from its own recent traffic.

With `model.store` and `model.candidate_every_seconds`, serve keeps the most recent lines
it scored that were *not* flagged (at most `candidate_max_lines`, per stream in order), and
every `candidate_every_seconds` (e.g. 86400: nightly), once it holds `candidate_min_lines`,
it continues the live version on them (`retrain.continue_training`: plus the lines operators
marked normal, when serve has a feedback database, plus the live version's kept sample of
older data) and adds the result to the store as a new version. It never promotes: the
candidate waits for `logstream models compare` (or a shadow run) and an operator's
`models promote` (docs/lifecycle.md).

Training runs on its own thread, off the scoring thread: scoring goes on (slower while both
share the CPU; set `model.threads` so they fit). One candidate trains at a time; a failure
is logged and counted, and serving is never affected.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from logstream.detector import ScoredLine
from logstream.lifecycle import model_store
from logstream.lifecycle.retrain import continue_training, write_sample
from logstream.lifecycle.train import TrainConfig, save
from logstream.metrics import CANDIDATES
from logstream.records import Stream

log = structlog.get_logger("logstream.lifecycle.candidate")


class CandidateTrainer:
    """Collects unflagged lines; `maybe_start` trains a candidate version when one is due."""

    def __init__(
        self,
        store: Path,
        every_seconds: float,
        min_lines: int,
        max_lines: int,
        config: TrainConfig,
        feedback_db: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.every_seconds = every_seconds
        self.min_lines = min_lines
        self.config = config
        self.feedback_db = feedback_db
        self.clock = clock
        self._lines: deque[tuple[str, str]] = deque(maxlen=max_lines)  # (stream, line), oldest first
        self._last = clock()
        self._thread: threading.Thread | None = None

    def observe(self, scored: Sequence[ScoredLine]) -> None:
        """Keep the lines that did not alert (a flagged line never trains a candidate)."""
        self._lines.extend(
            (s.record.stream, s.record.line) for s in scored if s.kind == "line" and not s.is_anomaly
        )

    @property
    def training(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def maybe_start(self) -> bool:
        """Start training a candidate if one is due and none is training; True if started."""
        if self.training or len(self._lines) < self.min_lines:
            return False
        if self.clock() - self._last < self.every_seconds:
            return False
        self._last = self.clock()
        by_stream: dict[str, list[str]] = {}
        for stream, line in self._lines:
            by_stream.setdefault(stream, []).append(line)
        self._lines.clear()  # the next candidate learns from traffic after this one
        streams = [Stream(name, lines) for name, lines in by_stream.items()]
        self._thread = threading.Thread(
            target=self._train, args=(streams,), name="logstream-candidate", daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _train(self, streams: list[Stream]) -> None:
        work = Path(tempfile.mkdtemp(prefix="logstream-candidate-"))
        try:
            live = model_store.live_dir(self.store)
            trained, used = continue_training(live, streams, self.config, feedback_db=self.feedback_db)
            save(trained, work / "model")
            write_sample(work / "model", used)
            version = model_store.add(
                self.store, work / "model", by="logstream serve",
                comment=f"scheduled candidate from {sum(len(s.lines) for s in streams)} unflagged lines",
            )  # fmt: skip
            CANDIDATES.labels(outcome="added").inc()
            log.info("candidate_added", version=version, parent=live.name, lines=trained.meta["new_lines"])
        except Exception as exc:  # a failed candidate must never stop serving: count, log, go on
            CANDIDATES.labels(outcome="failed").inc()
            log.error("candidate_training_failed", error=str(exc))
        finally:
            shutil.rmtree(work, ignore_errors=True)
