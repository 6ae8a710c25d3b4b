"""Where anomalies are handed off. Sources commit offsets only after `put` returns."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from logstream.records import Anomaly


class AnomalySink(Protocol):
    """A durable hand-off: when `put` returns, the anomalies survive a crash."""

    def put(self, anomalies: Sequence[Anomaly]) -> None: ...

    def healthy(self) -> bool:
        """False once the sink can no longer deliver (serve's /healthz fails on it)."""
        ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends anomalies to a JSONL file and fsyncs before returning."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def put(self, anomalies: Sequence[Anomaly]) -> None:
        if not anomalies:
            return
        for anomaly in anomalies:
            self._file.write(json.dumps(asdict(anomaly)) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def healthy(self) -> bool:
        """A file append has no background worker that could die: a failed put raises instead."""
        return True

    def close(self) -> None:
        self._file.close()
