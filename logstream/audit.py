"""serve's audit log: a JSON line per scored line, in files that rotate under a size cap
(logstream/rotating.py). Readers take the rotated files oldest first (`rotated_files`):
`logstream feedback --at`, `logstream models compare`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from logstream.rotating import FILES, MAX_BYTES, RotatingFile

if TYPE_CHECKING:
    from logstream.detector import ScoredLine


class AuditLog:
    """A JSON line per scored line, fsynced per batch: a backtest trail, an at-least-once proof."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, files: int = FILES) -> None:
        self._file = RotatingFile(path, max_bytes, files)

    def write(self, scored: Sequence[ScoredLine], model: str = "", shadow: bool = False) -> None:
        at = round(time.time(), 3)  # wall time, for `logstream models compare --since/--until`
        self._file.append(
            "".join(json.dumps(_entry(line, at, model, shadow)) + "\n" for line in scored).encode()
        )

    def close(self) -> None:
        self._file.close()


def _entry(line: ScoredLine, at: float, model: str, shadow: bool) -> dict[str, object]:
    entry: dict[str, object] = {
        "at": at,
        "source": line.record.source,
        "offset": line.record.offset,
        "stream": line.record.stream,
        "kind": line.kind,
        "score": round(line.score, 4),  # -log10 p, the one unit
        "surprisal": round(line.surprisal, 4),  # nats, the model alone
        "anomaly": line.is_anomaly,
        "template": line.template,  # what `logstream feedback --at topic/partition@offset` marks
        "model": model,  # the version that scored it (`logstream models compare`)
    }
    if line.verdict is not None:
        entry["verdict"] = line.verdict  # an operator's verdict on its template decided it
    if shadow:
        entry["shadow"] = True  # a candidate's score: it never reached the sink
    return entry
