"""Serve follows the model store: hot reload of the promoted version, and rollback, in seconds.

`ModelFollower.poll` runs on serve's scoring thread between two batches: every
`reload_seconds` it reads the store's live version (`live.jsonl`, one small file), and when a
promote or rollback changed it, loads that version and hands back a new Detector. The swap
happens between batches, so the batch in flight is scored, handed off and committed by the
model it started with; the Kafka consumer never stops (the fetcher and heartbeats run on
the event loop, untouched), and no offset is skipped or committed twice.

A version is swapped in only once it loaded and scored a trial line (`load_version`: its
files match the content hash the store recorded, config.json fits the weights, the model
scores a line to finite surprisals). Whatever goes wrong on the way, serving goes on with
the current model: the failure is logged (`model_reload_failed`, with the version and the
reason), counted (`logstream_model_load_failures_total`) and shown by
`logstream_model_fallback` (1 while serve scores with another version than the live one),
and the version is not tried again until the live version changes. At start, when the
live version does not load, serve walks back the way rollbacks go and serves the newest
version that loads (`model_version_skipped` for each one passed over).

Streams keep their context across the swap when the two versions share a tokenizer (a
model continued with `train --from` does): each stream's recent token ids are handed to
the new engine, which replays them, unscored, on the stream's next line (the same path as
a stream evicted and rebuilt). A fresh model has another vocabulary, so its streams start
cold. Operator feedback carries over as is.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from logstream.detector import Detector
from logstream.engine.metadata import ModelDirError, one_line
from logstream.errors import UserError
from logstream.lifecycle import model_store
from logstream.metrics import MODEL_FALLBACK, MODEL_LOAD_FAILURES
from logstream.records import LogRecord

log = structlog.get_logger(__name__)

TRIAL_STREAM = "logstream-trial-line"  # the stream a trial line is scored in, dropped after


def reason(exc: BaseException) -> str:
    """Why a model failed, in one line: a UserError's own message, else the type and message."""
    return str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {one_line(exc)}"


def load_checked(directory: Path, options: dict[str, Any]) -> Detector:
    """`Detector.load(directory, **options)`, once its model scored a trial line (the pattern
    prompt's first) to finite surprisals; the trial stream is dropped, so the detector starts
    as loaded. Anything that goes wrong is a ModelDirError naming the directory."""
    try:
        detector = Detector.load(directory, **options)
        line = next(iter(detector.meta["pattern_prompt"]), "logstream trial line")
        _, _, surprisal = detector.token_surprisal([LogRecord(line=line, stream=TRIAL_STREAM)])
        detector.engine.drop(TRIAL_STREAM)
    except UserError:
        raise
    except Exception as exc:  # a model that loads but cannot score is as unusable as one that does not load
        raise ModelDirError(f"{directory}: a trial line failed: {reason(exc)}") from None
    if not np.isfinite(surprisal[0]).all():
        raise ModelDirError(f"{directory}: a trial line scores NaN or infinite surprisal: damaged weights")
    return detector


def load_version(store: Path, version: str, options: dict[str, Any]) -> Detector:
    """A store version's Detector: its files checked against its content hash, then
    `load_checked`; StoreError or ModelDirError (one line) if it is not usable."""
    model_store.verify(store, version)
    return load_checked(model_store.version_dir(store, version), options)


def carry_streams(old: Detector, new: Detector) -> int:
    """Give `new` the recent tokens of `old`'s streams (replayed on their next line) when both
    share a tokenizer; how many streams were carried (0: they start cold)."""
    if old.tokenizer.hf.get_vocab() != new.tokenizer.hf.get_vocab():
        return 0
    recent = {name: state.recent for name, (state, *_) in old.engine.offloaded.items()}
    recent.update(old.engine.evicted)
    recent.update((name, state.recent) for name, state in old.engine.streams.items())
    for name, tokens in recent.items():
        new.engine.evicted[name] = deque(tokens, maxlen=new.engine.window)
    return len(recent)


class ModelFollower:
    """The store's live version, re-read every `reload_seconds`; loads a new one when it changed."""

    def __init__(
        self,
        store: Path,
        options: dict[str, Any],
        reload_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.options = options  # Detector.load's keyword arguments (device, window, threshold ...)
        self.reload_seconds = reload_seconds
        self.clock = clock
        self.version = model_store.live(store)  # the live version when the store was last read
        self.serving: str | None = None  # the version of the Detector serve scores with
        self._checked_at = clock()

    def load_live(self) -> Detector:
        """At start: the live version's Detector, or when it does not load, the newest one on
        the way rollbacks go that does; StoreError when nothing is promoted or none loads."""
        self.version = model_store.live(self.store)
        walk = model_store.rollback_path(self.store)
        if not walk:
            raise model_store.StoreError(
                f"model store {self.store}: nothing promoted yet (logstream models promote)"
            )
        failures = []
        for version in walk:
            try:
                detector = load_version(self.store, version, self.options)
            except Exception as exc:  # any failure: try the version before it
                MODEL_LOAD_FAILURES.inc()
                log.error("model_version_skipped", version=version, reason=reason(exc))
                failures.append(f"{version}: {reason(exc)}")
                continue
            if version != self.version:
                log.warning("model_fallback", version=version, live=self.version, skipped=len(failures))
            self._serve(version)
            return detector
        raise model_store.StoreError(
            f"model store {self.store}: no version on the rollback path loads ({'; '.join(failures)})"
        )

    def poll(self, current: Detector) -> Detector | None:
        """A Detector for the new live version if it changed since the last poll, else None.

        A version that does not load is logged, counted and skipped (serving goes on with the
        current one) until the live version changes again."""
        now = self.clock()
        if now - self._checked_at < self.reload_seconds:
            return None
        self._checked_at = now
        try:
            version = model_store.live(self.store)
        except OSError as exc:  # the store's volume went away: keep scoring, read it next time
            log.error("model_store_unreadable", store=str(self.store), reason=reason(exc))
            return None
        if version is None or version == self.version:
            return None
        self.version = version
        if version == self.serving:  # back to the version serve kept (a rollback past a failed one)
            self._serve(version)
            return None
        try:
            new = load_version(self.store, version, self.options)
            new.rules = current.rules
            carried = carry_streams(current, new)
        except Exception as exc:  # whatever the version does wrong, serving goes on
            MODEL_LOAD_FAILURES.inc()
            MODEL_FALLBACK.set(1)
            log.error("model_reload_failed", version=version, serving=self.serving, reason=reason(exc))
            return None
        log.info(
            "model_reloaded", version=version, previous=self.serving, model_id=new.model_id, streams=carried
        )
        self._serve(version)
        return new

    def _serve(self, version: str) -> None:
        self.serving = version
        MODEL_FALLBACK.set(int(version != self.version))
