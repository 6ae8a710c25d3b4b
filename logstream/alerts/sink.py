"""Where anomalies are handed off. Sources commit offsets only after `put` returns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from logstream.records import Anomaly
from logstream.rotating import FILES, MAX_BYTES, RotatingFile


class AnomalySink(Protocol):
    """A durable hand-off: when `put` returns, the anomalies survive a crash."""

    def put(self, anomalies: Sequence[Anomaly]) -> None: ...

    def healthy(self) -> bool:
        """False once the sink can no longer deliver (serve's /healthz fails on it)."""
        ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends anomalies to a JSONL file and fsyncs before returning; the file rotates at
    `max_bytes`, keeping at most `files` (logstream/rotating.py)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, files: int = FILES) -> None:
        self.path = Path(path)
        self._file = RotatingFile(self.path, max_bytes, files)

    def put(self, anomalies: Sequence[Anomaly]) -> None:
        if not anomalies:
            return
        self._file.append("".join(json.dumps(asdict(anomaly)) + "\n" for anomaly in anomalies).encode())

    def healthy(self) -> bool:
        """A file append has no background worker that could die: a failed put raises instead."""
        return True

    def close(self) -> None:
        self._file.close()
