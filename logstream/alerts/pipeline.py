"""Wiring: the alert sink for serve, and the replay dry run / delivery.

- `open_alert_sink(routes)` is the `AnomalySink` that serve and the Kafka
  consumer hand anomalies to: `put` commits them into the outbox (so offsets
  may be committed after it returns) and a background worker delivers.
  `close()` (the SIGTERM path) notifies groups still inside `group_wait` and
  keeps delivering for a grace period; what is left stays in the outbox.
- `run_replay_alerts(anomalies, routes, deliver=...)` shows what on-call
  would have received: grouping runs on event time (each anomaly's
  `detected_at`), timers fire at the moments they would have, and every group
  resolves at the end. With `deliver=True` the alerts are then sent.

Both keep an incident memory (logstream.memory) beside their outbox, so each firing alert
carries the past incidents most like it. The sink's is in the outbox file, shared with
`logstream incidents` and serve's HTTP port; a replay's is in memory and holds only the
replay's own incidents, so a backtest shows what its recurrences would have carried and
never writes to, or is swayed by, the live memory.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from logstream.alerts.alert import Alert, rfc3339
from logstream.alerts.config import AlertsConfig, load_config
from logstream.alerts.delivery import BackgroundDelivery, DeliveryWorker
from logstream.alerts.grouping import NEVER
from logstream.alerts.outbox import Outbox, OutboxError, channel_names
from logstream.memory.recorder import IncidentRecorder
from logstream.memory.retrieval import IncidentMemory
from logstream.memory.settings import IncidentMemorySettings
from logstream.records import Anomaly

if TYPE_CHECKING:
    from logstream.detector import Detector

log = structlog.get_logger(__name__)

MAX_REPLAY_STEPS = 1_000_000  # timer evaluations after the last anomaly (bounded loop)


class AlertSink:
    """AnomalySink over the outbox; delivers in a background thread when `deliver`. With
    `incidents` (settings), an incident memory in the outbox's file records every group and
    gives each firing alert its past incidents; `feedback_path` is where its verdicts are
    (default: the outbox file, as serve's default is)."""

    def __init__(
        self,
        config: AlertsConfig,
        *,
        deliver: bool = True,
        clock: Callable[[], float] = time.time,
        outbox_path: str | Path | None = None,
        incidents: IncidentMemorySettings | None = None,
        feedback_path: str | Path | None = None,
    ) -> None:
        path = outbox_path if outbox_path is not None else config.delivery.outbox
        self.outbox = Outbox(path, config, clock=clock)
        self.recorder: IncidentRecorder | None = None
        if incidents is not None:  # after the outbox: it made the file's folder
            try:
                memory = IncidentMemory(self.outbox.path, incidents, feedback_path=feedback_path, clock=clock)
            except BaseException:
                self.outbox.close()
                raise
            self.recorder = self.outbox.incidents = IncidentRecorder(memory)
        self.worker = DeliveryWorker(self.outbox, clock=clock)
        self.outbox.on_put = self.worker.wake
        self._background = BackgroundDelivery(self.worker) if deliver else None
        if self._background is not None:
            self._background.start()

    @property
    def memory(self) -> IncidentMemory | None:
        """The incident memory, when the sink keeps one."""
        return self.recorder.memory if self.recorder is not None else None

    def embed_with(self, model: Callable[[], Detector | None]) -> None:
        """Give new incidents the embedding of their lines by the model `model()` returns
        (computed on a thread of its own); without it incidents compare by their words."""
        if self.recorder is not None:
            self.recorder.embed_with(model)

    def incident_of(self, anomaly: Anomaly) -> str | None:
        """The fingerprint of the incident an anomaly is part of now (`Outbox.incident_of`)."""
        return self.outbox.incident_of(anomaly)

    def past_incidents(self, fingerprint: str) -> tuple[dict[str, Any], ...]:
        """The past incidents most like an incident, as its alert carries them (none without
        a memory)."""
        return self.recorder.past([fingerprint])[0] if self.recorder is not None else ()

    def put(self, anomalies: Sequence[Anomaly]) -> None:
        """Durable when it returns: the anomalies are folded into committed groups."""
        self.outbox.put(anomalies)

    def healthy(self) -> bool:
        """False once the delivery worker is dead or keeps failing (see BackgroundDelivery)."""
        return self._background is None or self._background.healthy()

    def close(self, grace: float | None = None) -> None:
        """Shut down without dropping alerts: notify the groups still in `group_wait` now,
        deliver for up to `grace` seconds (default `delivery.shutdown_grace`), then close.
        Anything not delivered by then is durable in the outbox for the next process."""
        grace = self.outbox.config.delivery.shutdown_grace if grace is None else grace
        try:
            made = self.outbox.flush(self.outbox.clock(), early=True)
            if made:
                log.info("alerts_flushed_on_close", notifications=len(made))
        except (OutboxError, sqlite3.Error) as exc:  # the groups stay durable: report, still close
            log.error("alerts_flush_on_close_failed", error=str(exc))
        if self._background is not None:
            self._background.stop(grace)
        try:
            pending = self.outbox.pending()
        except sqlite3.Error:
            pending = -1  # unknown; the flush error above (or the worker's) says why
        if pending:
            log.warning("alerts_pending_at_close", pending=pending, outbox=self.outbox.path)
        if self.recorder is not None:
            self.recorder.close()
        self.outbox.close()


def open_alert_sink(
    routes: str | Path,
    *,
    deliver: bool = True,
    incidents: IncidentMemorySettings | None = None,
    feedback_path: str | Path | None = None,
) -> AlertSink:
    """Load a routes file (AlertConfigError on any problem) and open its outbox
    (OutboxError when the database is corrupt, locked or cannot be created) with its
    incident memory (`incidents`: default settings when not given; IncidentError when the
    memory cannot be opened)."""
    return AlertSink(
        load_config(routes),
        deliver=deliver,
        incidents=incidents if incidents is not None else IncidentMemorySettings(),
        feedback_path=feedback_path,
    )


def run_replay_alerts(
    anomalies: Iterable[Anomaly],
    routes: str | Path | AlertsConfig,
    *,
    deliver: bool = False,
    timeout: float = 60.0,
    outbox_path: str | Path | None = None,
    incidents: IncidentMemorySettings | None = None,
    feedback_path: str | Path | None = None,
) -> tuple[list[Alert], int]:
    """Alerts on-call would have received, in order; and how many deliveries are still
    pending (0 unless `deliver` and the receivers did not all answer within `timeout`).

    The dry run keeps its outbox in memory; `deliver` uses `outbox_path` (default: the
    routes file's outbox with a `.replay` suffix) so a crash loses nothing. The incident
    memory (`incidents` settings, default ones when not given) is in memory and holds the
    replay's own incidents; its verdicts are `feedback_path`'s (none when not given). Pass
    a loaded config to check the routes file before a long replay."""
    config = routes if isinstance(routes, AlertsConfig) else load_config(routes)
    if deliver and outbox_path is None:
        outbox_path = Path(config.delivery.outbox).with_suffix(".replay.sqlite")
    event_time = [0.0]

    def clock() -> float:
        return event_time[0]

    outbox = Outbox(outbox_path if deliver else ":memory:", config, clock=clock)
    settings = incidents if incidents is not None else IncidentMemorySettings()
    try:
        memory = IncidentMemory(":memory:", settings, feedback_path=feedback_path, clock=clock)
    except BaseException:
        outbox.close()
        raise
    recorder = outbox.incidents = IncidentRecorder(memory)
    try:
        alerts: list[Alert] = []
        for anomaly in anomalies:
            event_time[0] = max(event_time[0], anomaly.detected_at)
            alerts += _advance(outbox, until=event_time[0])
            outbox.put([anomaly])
        alerts += _advance(outbox, until=float("inf"))  # until every group resolved
        pending = 0
        if deliver:
            outbox.restamp_pending(time.time())
            pending = drain(outbox, timeout=timeout)
        return alerts, pending
    finally:
        recorder.close()
        outbox.close()


def _advance(outbox: Outbox, until: float) -> list[Alert]:
    """Fire group timers in time order up to `until` (event-time simulation)."""
    made: list[Alert] = []
    for _ in range(MAX_REPLAY_STEPS):
        due = outbox.next_eval()
        if due is None or due >= NEVER or due > until:
            break
        made += outbox.flush(due)
    return made


def drain(outbox: Outbox, *, timeout: float, clock: Callable[[], float] = time.time) -> int:
    """Deliver until nothing is pending or `timeout` (real seconds) passes; returns what
    is still pending. `clock` drives the group timers and retry schedule."""
    stop = threading.Event()
    worker = DeliveryWorker(outbox, clock=clock)
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        worker.run(stop, until_idle=True)
    finally:
        timer.cancel()
    return outbox.pending()


def format_alert(alert: Alert, config: AlertsConfig) -> str:
    """One line per notification, for the replay dry run."""
    names = [n for n, resolved in channel_names(config, alert.receiver)
             if alert.status == "firing" or resolved]  # fmt: skip
    return (
        f"{rfc3339(alert.notified_at)} {alert.status:<8} #{alert.sequence} {alert.severity:<8} "
        f"-> {','.join(names) or '(no channel)'}  {alert.summary}"
    )
