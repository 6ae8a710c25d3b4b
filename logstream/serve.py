"""The live service: Kafka consumer group -> Detector -> AnomalySink -> commit.

Two tasks share one event loop. The fetcher polls Kafka and queues parsed
batches; the scorer takes them in order and runs `Detector.score` plus
`sink.put` on a single worker thread (so heartbeats and fetches go on while
the model works), then commits `offset + 1` of what it covered. Nothing is
committed before `put` returned: a crash at any point re-delivers, never
loses (at-least-once).

Backpressure: when more than `max_inflight_lines` lines are queued or being
scored, the assigned partitions are paused (the fetcher keeps polling, so the
consumer stays in the group) and resumed below half of it.

Memory: streams are tracked for `stream_idle_seconds` in an LRU of at most
`max_tracked_streams` keys (one hostile producer can send a new key per line);
a stream pushed out is forgotten, not closed.

Health: /healthz fails once the scorer loop has ended, the sink reports that it
no longer delivers (`sink.healthy()`), or the consumer holds partitions but has not
fetched for `fetch_stall_seconds` (a rebalance callback or the scorer stuck), so a
liveness probe restarts a pod that would otherwise keep its partitions and score nothing.

Rebalance: on revoke the fetcher stops, the scorer finishes what is queued,
and the processed offsets are committed before the partitions go; on assign
fetching resumes, whatever the assignment's own work raised. With `state.changelog_topic`,
streams' state is written before each commit and restored on assign before fetching
(logstream/kafka_state.py; a stream whose restore fails starts cold); with
`repartition.topic`, the scorer reads that topic (consumers/repartition.py). SIGTERM/SIGINT: stop fetching, finish the batch being
scored, commit, leave the group, all within `shutdown_grace_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog
import torch
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from logstream import __version__, serve_check
from logstream.alerts.context import LineContext, anomalies_of
from logstream.alerts.pipeline import AlertSink, open_alert_sink
from logstream.alerts.sink import AnomalySink, JsonlSink
from logstream.audit import AuditLog
from logstream.consumers.kafka import Batch, KafkaSource
from logstream.consumers.parse import RecordParser, RejectLog
from logstream.consumers.repartition import (
    Repartitioner,
    prepare_topic,
    scorer_inputs,
    serve_repartition,
)
from logstream.detector import Detector, ScoredLine
from logstream.http_api import open_feedback, serve_feedback
from logstream.kafka_state import Changelog, StreamBook, restore_failed
from logstream.lifecycle.candidate import CandidateTrainer
from logstream.lifecycle.follower import ModelFollower
from logstream.lifecycle.shadow import Shadow, count_live
from logstream.lifecycle.train import TrainConfig
from logstream.metrics import (
    ACTIVE_STREAMS,
    ANOMALIES,
    ASSIGNED_PARTITIONS,
    BUILD_INFO,
    CACHE_BYTES,
    FEEDBACK_SUPPRESSED,
    INFLIGHT_LINES,
    LINE_SCORE,
    LINES,
    MODEL_RELOADS,
    PAUSED_PARTITIONS,
    QUIET_WATCHED,
    RESTORE_SECONDS,
    RESTORED_STREAMS,
    SCORE_SECONDS,
    TEMPLATES,
    THRESHOLD,
    TRACKED_STREAM_EVICTIONS,
    TRACKED_STREAMS,
    Health,
    HttpLimits,
    serve_http,
)
from logstream.records import LogRecord
from logstream.scoring.quiet import QuietWatch
from logstream.settings import ServeSettings, SettingsError, SinkSettings, load_settings

log = structlog.get_logger(__name__)

# Sink kinds by name (settings `sink.kind`).
SINKS: dict[str, Callable[[ServeSettings], AnomalySink]] = {
    "alerts": lambda settings: open_alert_sink(
        _routes(settings.sink), incidents=settings.incidents, feedback_path=settings.feedback.database
    ),
    "jsonl": lambda settings: JsonlSink(settings.sink.path, settings.sink.max_bytes, settings.sink.files),
}


def _routes(sink: SinkSettings) -> Path:
    assert sink.routes is not None  # SinkSettings: kind alerts needs routes
    return sink.routes


def open_sink(settings: ServeSettings) -> AnomalySink:
    """The sink `sink.kind` names; with the alert pipeline, its incident memory beside the
    outbox (`incidents`, verdicts from `feedback.database`)."""
    return SINKS[settings.sink.kind](settings)


class Service:
    """One consumer-group member: see the module docstring for the flow."""

    def __init__(
        self,
        settings: ServeSettings,
        detector: Detector,
        sink: AnomalySink,
        health: Health,
        audit: AuditLog | None = None,
        follower: ModelFollower | None = None,
        shadow: Shadow | None = None,
        candidates: CandidateTrainer | None = None,
    ) -> None:
        self.settings = settings
        self.follower = follower  # model.store: hot reload between batches
        self.shadow = shadow  # model.shadow: a candidate that never pages
        self.candidates = candidates  # model.candidate_every_seconds: scheduled new versions
        self.detector = detector
        self.sink = sink
        self.health = health
        self.audit = audit
        self.rejects = RejectLog()
        self.context = LineContext()  # lines around an anomaly, for its alert
        self.quiet = QuietWatch() if settings.quiet_sources else None  # sources that stop logging
        kafka, inputs = scorer_inputs(settings)  # the repartition topic, when there is one
        self.source = KafkaSource(kafka, RecordParser(inputs), self.rejects, _Listener(self))
        # per-stream counters (cold start, split streams) and, with a changelog, their state
        self.book = StreamBook(settings.state, settings.max_tracked_streams)
        self.changelog = (
            Changelog(kafka, settings.state, kafka.topics) if settings.state.changelog_topic else None
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logstream-score")
        self._queue: asyncio.Queue[Batch] = asyncio.Queue()
        self._inflight = 0  # lines queued or being scored
        self._drained = asyncio.Event()  # set while nothing is queued or being scored
        self._drained.set()
        self._may_fetch = asyncio.Event()  # cleared during a revoke
        self._may_fetch.set()
        self._paused = False
        self._processed: dict[TopicPartition, int] = {}  # handed off, maybe not yet committed
        # stream -> monotonic time of its last line, least recently seen first (idle closing only)
        self._last_seen: OrderedDict[str, float] = OrderedDict()
        self._current: asyncio.Future[None] | None = None  # the scorer's work in progress
        self._next_commit = 0.0  # with a changelog, commits (and its writes) are this far apart
        # cleared while assigned partitions' streams are restored: a fetch already in flight
        # can return their lines, which must not be scored before their state is back
        self._restored = asyncio.Event()
        self._restored.set()
        # /healthz: partitions held (from an assignment's start to a revoke's end) and the
        # last completed fetch; holding without fetching for fetch_stall_seconds is a stall
        self._holding = False
        self._fetched_at = time.monotonic()
        health.fetching = self._fetching

    async def run(self, stop: asyncio.Event) -> bool:
        """Serve until `stop` is set; then shut down gracefully. False if the grace ran out."""
        if self.changelog is not None:
            await self.changelog.start()
        await self.source.start()
        fetcher = asyncio.create_task(self._fetch_loop(), name="fetcher")
        scorer = asyncio.create_task(self._score_loop(), name="scorer")
        scorer.add_done_callback(self._scorer_ended)
        stopper = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait({fetcher, scorer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in done - {stopper}:
            task.result()  # a crashed loop is a bug: raise; uncommitted lines are re-delivered
        log.info("shutting_down", grace_seconds=self.settings.shutdown_grace_seconds)
        try:
            async with asyncio.timeout(self.settings.shutdown_grace_seconds):
                await self._shutdown(fetcher, scorer)
        except TimeoutError:
            log.error("shutdown_grace_exceeded", uncommitted_lines="re-delivered")
            return False
        finally:
            self.health.alive = False
        return True

    def _fetching(self) -> bool:
        """False while partitions are held and no fetch completed for fetch_stall_seconds.
        (Called from the HTTP thread: reads two plain attributes.)"""
        stalled = time.monotonic() - self._fetched_at > self.settings.fetch_stall_seconds
        return not (self._holding and stalled)

    def _scorer_ended(self, task: asyncio.Task[None]) -> None:
        """The scorer never ends on its own: whatever ended it, /healthz must say so."""
        self.health.scoring = False
        if not task.cancelled() and task.exception() is not None:
            log.error("scorer_loop_died", error=repr(task.exception()))

    async def _shutdown(self, fetcher: asyncio.Task[None], scorer: asyncio.Task[None]) -> None:
        fetcher.cancel()
        dropped = 0
        while not self._queue.empty():  # not started: left uncommitted, re-delivered later
            dropped += self._queue.get_nowait().messages
        scorer.cancel()
        await asyncio.gather(fetcher, scorer, return_exceptions=True)
        if self._current is not None:
            await self._current  # the batch being scored: finish, hand off, commit
        self._drained.set()  # nothing left for a last revoke to wait for
        await self._commit()
        await self.source.stop()  # its last revoke writes the changelog and commits
        if self.changelog is not None:
            await self.changelog.stop()
        self._worker.shutdown(wait=True)
        log.info("stopped", dropped_unscored_messages=dropped)

    async def _fetch_loop(self) -> None:
        while True:
            await self._may_fetch.wait()
            batch = await self.source.fetch()
            self._fetched_at = time.monotonic()
            if not batch.messages:
                if self.changelog is not None and self._processed and self._queue.empty():
                    self._queue.put_nowait(batch)  # quiet: the scorer commits once it is due
                continue
            self._inflight += len(batch.records)
            self._drained.clear()
            self._queue.put_nowait(batch)
            INFLIGHT_LINES.set(self._inflight)
            if not self._paused and self._inflight >= self.settings.max_inflight_lines:
                self.source.pause()
                self._paused = True
                PAUSED_PARTITIONS.set(len(self.source.assignment()))
                log.info("backpressure_paused", inflight_lines=self._inflight)

    async def _score_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                batch = await asyncio.wait_for(self._queue.get(), timeout=self._idle_wait())
            except TimeoutError:
                work = loop.run_in_executor(self._worker, self._idle_tick)
            else:
                await self._restored.wait()
                self._coalesce(batch)
                work = asyncio.ensure_future(self._handle(batch))
            # shielded: a shutdown cancels this loop, but `_shutdown` awaits the work to its end
            self._current = work
            await asyncio.shield(work)

    def _coalesce(self, batch: Batch) -> None:
        """Merge fetches that queued up while the model was busy, until max_poll_records lines.

        Under a steady trickle each fetch holds a few lines; scoring them together keeps
        the per-batch costs (a forward pass per stream, a sink put, a commit) from
        dominating, and lets the consumer catch up when it falls behind. (The last fetch
        taken may carry the batch past the limit, to at most twice it.)
        """
        while not self._queue.empty() and len(batch.records) < self.settings.kafka.max_poll_records:
            batch.extend(self._queue.get_nowait())

    async def _handle(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        if batch.records:
            await loop.run_in_executor(self._worker, self._score_and_hand_off, batch)
        self._processed.update(batch.next_offsets)
        if self.changelog is None or time.monotonic() >= self._next_commit:
            await self._commit()
        self.source.record_lag(batch.next_offsets)
        self._inflight -= len(batch.records)
        INFLIGHT_LINES.set(self._inflight)
        if self._queue.empty():
            self._drained.set()
        if self._paused and self._inflight <= self.settings.max_inflight_lines // 2:
            self.source.resume()
            self._paused = False
            PAUSED_PARTITIONS.set(0)
            log.info("backpressure_resumed", inflight_lines=self._inflight)

    def _score_and_hand_off(self, batch: Batch) -> None:
        """Worker thread: score, hand anomalies to the sink (durable on return), audit."""
        if self.follower is not None:
            self._follow(self.follower)
        records = [r for r in batch.records if not self.book.already_scored(r)]
        started = time.perf_counter()
        step = self.detector.step(records, self.quiet)
        SCORE_SECONDS.observe(time.perf_counter() - started)
        scored = self.book.observe(step.lines)
        now = time.monotonic()
        if self.settings.stream_idle_seconds is not None:
            self._track(batch.records, now)
            scored += self._idle_stream_ends(now)
        self._put(scored + step.quiet)
        if self.quiet is not None:
            QUIET_WATCHED.set(len(self.quiet))
        count_live(scored)
        if self.candidates is not None:  # after the hand-off; trains on its own thread
            self.candidates.observe(scored)
            self.candidates.maybe_start()
        if self.shadow is not None:  # after the hand-off: a candidate never delays an alert
            shadowed = self.shadow.score(batch.records, scored)
            if shadowed is None:
                self.shadow = None  # it failed (counted, logged): the live model goes on alone
            elif self.audit is not None:
                self.audit.write(shadowed, self.shadow.detector.model_id, shadow=True)
        LINES.inc(len(batch.records))

    def _follow(self, follower: ModelFollower) -> None:
        """Between batches: switch to the store's live version if a promote or rollback changed it."""
        new = follower.poll(self.detector)
        if new is not None:
            self.detector = new
            BUILD_INFO.clear()
            BUILD_INFO.labels(version=__version__, model_id=new.model_id).set(1)
            MODEL_RELOADS.inc()

    def _track(self, records: Sequence[LogRecord], now: float) -> None:
        """Mark the records' streams as just seen; forget the least recently seen past the cap."""
        for record in records:
            self._last_seen[record.stream] = now
            self._last_seen.move_to_end(record.stream)
        evicted = 0
        while len(self._last_seen) > self.settings.max_tracked_streams:
            self._last_seen.popitem(last=False)
            evicted += 1
        if evicted:
            TRACKED_STREAM_EVICTIONS.inc(evicted)
        TRACKED_STREAMS.set(len(self._last_seen))

    def _idle_wait(self) -> float | None:
        """How long the scorer waits for a batch before its idle tick: half stream_idle_seconds
        (to end quiet streams), and the verdicts' refresh period, so that they, their metrics
        and a locked database's recovery stay current while no line comes (None: no tick)."""
        idle = self.settings.stream_idle_seconds
        waits = [idle / 2] if idle else []
        if self.detector.rules is not None:
            waits.append(self.settings.feedback.refresh_seconds)
        return min(waits, default=None)

    def _idle_tick(self) -> None:
        """Worker thread, while no batch comes: re-read the verdicts if due, and end streams
        quiet past stream_idle_seconds (their end scores)."""
        if self.detector.rules is not None:
            self.detector.rules.refresh()
        if self.settings.stream_idle_seconds:
            self._put(self._idle_stream_ends(time.monotonic()))

    def _idle_stream_ends(self, now: float) -> list[ScoredLine]:
        assert self.settings.stream_idle_seconds is not None
        quiet = []
        for stream, seen in self._last_seen.items():  # least recently seen first
            if now - seen <= self.settings.stream_idle_seconds:
                break
            quiet.append(stream)
        ends = []
        for stream in quiet:
            del self._last_seen[stream]
            end = self.detector.close(stream)
            self.book.closed(stream)
            if end is not None:
                ends.append(end)
        TRACKED_STREAMS.set(len(self._last_seen))
        return ends

    def _put(self, scored: Sequence[ScoredLine]) -> None:
        anomalies = anomalies_of(self.detector, self.context, scored)
        self.sink.put(anomalies)
        if self.audit is not None:
            self.audit.write(scored, self.detector.model_id)
        FEEDBACK_SUPPRESSED.inc(sum(line.suppressed for line in scored))
        for anomaly in anomalies:
            ANOMALIES.labels(kind=anomaly.kind, severity=anomaly.severity).inc()
        for line in scored:
            if line.kind == "line":
                LINE_SCORE.observe(line.score)
        THRESHOLD.set(self.detector.threshold)
        CACHE_BYTES.set(self.detector.cache_bytes)
        ACTIVE_STREAMS.set(len(self.detector.engine.streams))
        TEMPLATES.set(self.detector.scorer.miner.size)

    async def _commit(self) -> None:
        offsets = dict(self._processed)
        if self.changelog is not None:
            if not await self._write_changelog():
                return  # state goes before the offsets it covers (logstream/kafka_state.py)
            self._next_commit = time.monotonic() + self.settings.state.changelog_interval_seconds
        if offsets and await self.source.commit(offsets):
            # offsets handed off while the commit was in flight stay for the next one
            for tp, offset in offsets.items():
                if self._processed.get(tp) == offset:
                    del self._processed[tp]

    async def _write_changelog(self) -> bool:
        """The states of streams scored since the last write (taken on the worker, between
        batches), acknowledged; False if the write failed (they go again with the next)."""
        assert self.changelog is not None
        loop = asyncio.get_running_loop()
        states, closed = await loop.run_in_executor(self._worker, self.book.take_changes, self.detector)
        if not states and not closed:
            return True
        if await self.changelog.write(states, closed):
            return True
        self.book.give_back(states, closed)
        return False

    async def _restore(self, assigned: set[TopicPartition]) -> None:
        """Streams of the assigned partitions from the changelog, re-encoded, before fetching."""
        assert self.changelog is not None
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        sources = {f"{tp.topic}/{tp.partition}" for tp in assigned}
        dropped = await loop.run_in_executor(
            self._worker, self.book.forget_unassigned, self.detector, sources
        )
        detector = self.detector
        try:
            states = await self.changelog.read(sources, detector.model_id, detector.engine.vocab_size)
        except Exception as exc:  # the topic unreadable, past restore_timeout_seconds, anything
            restore_failed("read", 0, partitions=sorted(sources), error=str(exc) or repr(exc))
            return
        restored = await loop.run_in_executor(self._worker, self.book.restore, detector, states)
        if self.settings.stream_idle_seconds is not None:
            now = time.monotonic()
            for state in states:
                self._last_seen[state.stream] = now
        seconds = time.perf_counter() - started
        RESTORED_STREAMS.inc(restored)
        RESTORE_SECONDS.observe(seconds)
        log.info(
            "changelog_streams_restored",
            restored=restored, records=len(states), dropped=dropped, seconds=round(seconds, 3),
        )  # fmt: skip

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish what is queued, commit it, then let the partitions go."""
        self._may_fetch.clear()
        await self._drained.wait()
        await self._commit()
        self._processed = {tp: o for tp, o in self._processed.items() if tp not in revoked}
        self.health.partitions_assigned = False
        self._holding = False
        log.info("partitions_revoked", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in revoked))

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Fresh partitions start unpaused; their streams are restored from the changelog if
        there is one, else set up on their first line. Fetching resumes whatever this raised
        (aiokafka only logs a callback's exception: a partition kept and never fetched again)."""
        # the stall clock starts with the hand-over, however long the join before it took
        self._holding, self._fetched_at = bool(assigned), time.monotonic()
        try:
            self._paused = False
            self.source.assigned(assigned)
            if self.changelog is not None:
                self._restored.clear()
                await self._restore(assigned)
            else:  # streams that moved away: if they came back, a stale cache and line count here
                # would score them against an old context, and keep the cold-start policy off
                sources = {f"{tp.topic}/{tp.partition}" for tp in assigned}
                await asyncio.get_running_loop().run_in_executor(
                    self._worker, self.book.forget_unassigned, self.detector, sources
                )
            PAUSED_PARTITIONS.set(0)
            ASSIGNED_PARTITIONS.set(len(assigned))
            log.info(
                "partitions_assigned",
                partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned),
            )
        finally:
            self._restored.set()
            self.health.partitions_assigned = bool(assigned)
            self._may_fetch.set()


class _Listener(ConsumerRebalanceListener):
    def __init__(self, service: Service) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.service.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.service.on_assigned(set(assigned))


def configure_logging(log_format: str, level: str) -> None:
    """structlog to stderr: JSON in production, console on a TTY (`auto` picks by isatty)."""
    as_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


async def serve(settings: ServeSettings) -> int:
    """Load the model, start the endpoints, serve until SIGTERM/SIGINT; the exit code."""
    health = Health()
    feedback = open_feedback(settings)
    limits = HttpLimits(settings.http.timeout_seconds, settings.http.max_connections)
    try:
        server = serve_http(settings.http.host, settings.http.port, health, limits)
    except OSError as exc:
        address = f"{settings.http.host}:{settings.http.port}"
        raise SettingsError(f"http: cannot listen on {address}: {exc.strerror}") from None
    feedback_server = serve_feedback(settings, feedback) if feedback is not None else None
    servers = [server] + ([feedback_server] if feedback_server is not None else [])
    if settings.model.threads is not None:
        torch.set_num_threads(settings.model.threads)
    sink: AnomalySink | None = None
    audit: AuditLog | None = None
    try:
        sink = open_sink(settings)  # first: a bad routes file fails fast
        health.sink_healthy = sink.healthy
        if feedback is not None and isinstance(sink, AlertSink):
            feedback.incidents = sink.memory  # the feedback port's /incidents routes
        audit = (
            AuditLog(settings.audit_log, settings.audit_log_max_bytes, settings.audit_log_files)
            if settings.audit_log
            else None
        )
        options = {
            "device": settings.model.device, "window": settings.model.window,
            "max_streams": settings.model.max_streams, "int8_ring": settings.model.int8_ring,
            "false_alarm_rate": settings.model.false_alarm_rate, "threshold": settings.model.threshold,
        }  # fmt: skip
        follower, shadow, candidates = None, None, None
        if settings.model.store is not None:
            follower = ModelFollower(settings.model.store, options, settings.model.reload_seconds)
            detector = await asyncio.to_thread(follower.load_live)
            if settings.model.shadow is not None:  # None when it does not load: serve goes on without
                shadow = await asyncio.to_thread(
                    Shadow.open, settings.model.store, settings.model.shadow, options
                )
            if settings.model.candidate_every_seconds is not None:
                candidates = CandidateTrainer(
                    settings.model.store, settings.model.candidate_every_seconds,
                    settings.model.candidate_min_lines, settings.model.candidate_max_lines,
                    TrainConfig(max_steps=settings.model.candidate_steps),
                    feedback_db=Path(feedback.store.path) if feedback is not None else None,
                )  # fmt: skip
        else:
            assert settings.model.dir is not None  # ModelSettings: exactly one of dir and store
            detector = await asyncio.to_thread(Detector.load, settings.model.dir, **options)
        if feedback is not None:
            detector.rules, feedback.normalizer = feedback.rules, detector.normalizer
            if shadow is not None:
                shadow.detector.rules = feedback.rules
        health.model_loaded = True
        BUILD_INFO.labels(version=__version__, model_id=detector.model_id).set(1)
        THRESHOLD.set(detector.threshold)
        log.info("model_loaded", model_id=detector.model_id, threshold=detector.threshold)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        stage = None
        if settings.repartition.topic is not None:
            await prepare_topic(settings)
        if settings.repartition.topic is not None and settings.repartition.in_process:
            stage = asyncio.create_task(Repartitioner(settings).run(stop), name="repartition")
            stage.add_done_callback(lambda _: stop.set())  # a stage that died stops serve too
        service = Service(settings, detector, sink, health, audit, follower, shadow, candidates)
        if isinstance(sink, AlertSink):  # new incidents' lines, embedded by the live model
            sink.embed_with(lambda: service.detector)
        graceful = await service.run(stop)
        if stage is not None:
            await stage  # raises if it died: a bug or Kafka gone, exit non-zero
        if not graceful:
            # the worker may be stuck in a batch: exit now, as the grace promised (what was
            # handed off is durable; the rest is uncommitted and will be re-delivered)
            os._exit(1)
        return 0
    finally:
        if sink is not None:
            sink.close()
        if audit is not None:
            audit.close()
        for running in servers:
            running.shutdown()
        if feedback is not None:
            feedback.store.close()


async def _repartition_only(settings: ServeSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve_repartition(settings, stop)
    return 0


def main(config_path: Path | str | None, check: bool = False, role: str = "scorer") -> int:
    """`logstream serve --config FILE [--check] [--role scorer|repartition]`: the exit status.
    Settings, routes, model and outbox errors are `UserError`s, which the CLI prints as one
    line with exit 2."""
    settings = load_settings(config_path)
    if check:  # the model and the routes too, without Kafka (logstream/serve_check.py)
        print(serve_check.check(settings, config_path), file=sys.stderr)
        return 0
    configure_logging(settings.log_format, settings.log_level)
    if role == "repartition" and settings.repartition.topic is None:
        raise SettingsError("--role repartition needs repartition.topic")
    try:
        return asyncio.run(_repartition_only(settings) if role == "repartition" else serve(settings))
    except KafkaError as exc:
        print(f"error: kafka: {exc}", file=sys.stderr)
        return 1
