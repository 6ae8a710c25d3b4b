"""Serve follows the model store: hot reload of the promoted version, and rollback, in seconds.

`ModelFollower.poll` runs on serve's scoring thread between two batches: every
`reload_seconds` it reads the store's live version (`live.jsonl`, one small file), and when a
promote or rollback changed it, loads that version and hands back a new Detector. The swap
happens between batches, so the batch in flight is scored, handed off and committed by the
model it started with; the Kafka consumer never stops (the fetcher and heartbeats run on
the event loop, untouched), and no offset is skipped or committed twice.

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

import structlog

from logstream import model_store
from logstream.detector import Detector
from logstream.errors import UserError

log = structlog.get_logger(__name__)


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
        self.version = model_store.live(store)
        self._checked_at = clock()

    def load_live(self) -> Detector:
        """The live version's Detector (at start); StoreError when nothing is promoted."""
        directory = model_store.live_dir(self.store)
        self.version = directory.name
        return Detector.load(directory, **self.options)

    def poll(self, current: Detector) -> Detector | None:
        """A Detector for the new live version if it changed since the last poll, else None.

        A version that does not load is logged and skipped (serving goes on with the current
        one) until the live version changes again."""
        now = self.clock()
        if now - self._checked_at < self.reload_seconds:
            return None
        self._checked_at = now
        version = model_store.live(self.store)
        if version is None or version == self.version:
            return None
        previous, self.version = self.version, version
        try:
            new = Detector.load(model_store.version_dir(self.store, version), **self.options)
        except UserError as exc:
            log.error("model_reload_failed", version=version, error=str(exc))
            return None
        new.rules = current.rules
        carried = carry_streams(current, new)
        log.info("model_reloaded", version=version, previous=previous, model_id=new.model_id, streams=carried)
        return new
