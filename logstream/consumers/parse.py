"""Raw message -> LogRecord: plain or JSON records, and the stream key.

Every source (Kafka, file, stdin) hands its raw bytes here, so bad input is
judged the same way everywhere: undecodable bytes, a NUL byte (binary data),
oversized messages, bad JSON, a JSON record without its message field, and
empty values become a `Rejected` with a kind. Rejects are counted and logged once per kind by
`RejectLog`. `parse` never raises: hostile input (JSON nested deeper than the
recursion limit, a 5,000-digit number) is a `bad_json` reject, and anything
else a parser can raise on input becomes an `unparsable` reject, so one
message can never stop a consumer.

Besides the line and its stream, a record may carry labels for alert routing
(`input.label_fields`: label -> JSON field; `input.label_regex`: named groups
on the line) and its event time (`input.timestamp_field`, RFC 3339 or unix
seconds/milliseconds; else the source's own timestamp). A label or time that
cannot be found is left out: that is not an error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from logstream.metrics import BAD_RECORDS
from logstream.records import LogRecord
from logstream.regex import compile_safe, search_key
from logstream.settings import InputSettings

REJECT_KINDS = ("undecodable", "binary", "oversized", "bad_json", "missing_field", "empty", "unparsable")

# What a parser may raise on hostile input (RecursionError: JSON nested past the recursion
# limit; ValueError: a 5,000-digit JSON number; UnicodeError: lone surrogates; the rest: a value
# of a shape no branch foresaw). Never MemoryError or KeyboardInterrupt.
INPUT_ERRORS = (
    RecursionError,
    ValueError,
    UnicodeError,
    OverflowError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
)
MAX_DETAIL_CHARS = 200  # a reject's detail is logged: never the hostile payload itself
MAX_LABEL_CHARS = 128  # a label value from a record is cut to this (it is routed on, not read)
_MILLIS_AFTER = 1e11  # a numeric event time above this is in milliseconds (1e11 s is year 5138)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that will not be scored: `kind` is one of REJECT_KINDS."""

    kind: str
    detail: str


class RecordParser:
    """Turns one raw message (value bytes + optional key) into a LogRecord or a Rejected.

    A message is one log line: trailing whitespace is dropped and inner line
    breaks become spaces (the model reads a newline as the end of a line).
    A stream key that cannot be found (no message key, no such JSON field, no
    regex match) falls back to `default_stream`; that is not an error.
    """

    def __init__(self, settings: InputSettings) -> None:
        self.settings = settings
        self._regex = compile_safe(settings.stream_regex) if settings.stream_regex else None
        self._message_path = settings.message_field.split(".")
        self._stream_path = settings.stream_field.split(".") if settings.stream_field else None
        self._label_paths = {name: path.split(".") for name, path in settings.label_fields.items()}
        self._label_regex = compile_safe(settings.label_regex) if settings.label_regex else None
        self._time_path = settings.timestamp_field.split(".") if settings.timestamp_field else None

    def parse(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        source: str = "",
        offset: int | None = None,
        timestamp: float | None = None,
        source_kind: str = "",
    ) -> LogRecord | Rejected:
        """The message's LogRecord, or a Rejected saying why not; never raises on any input."""
        try:
            return self._parse(value, key, source, offset, timestamp, source_kind)
        except INPUT_ERRORS as exc:
            return Rejected("unparsable", f"{type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS])

    def _parse(
        self,
        value: bytes | None,
        key: bytes | None,
        source: str,
        offset: int | None,
        timestamp: float | None,
        source_kind: str,
    ) -> LogRecord | Rejected:
        if value is None or not value.strip():
            return Rejected("empty", "no value" if value is None else "blank value")
        if len(value) > self.settings.max_message_bytes:
            limit = self.settings.max_message_bytes
            return Rejected("oversized", f"{len(value)} bytes > max_message_bytes {limit}")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected("undecodable", f"not UTF-8 at byte {exc.start}")
        fields: dict[str, Any] | None = None
        if self.settings.format == "json":
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as exc:
                return Rejected("bad_json", f"{exc.msg} at char {exc.pos}")
            except RecursionError:
                return Rejected("bad_json", "nested too deeply")
            except ValueError as exc:  # e.g. an integer past sys.get_int_max_str_digits()
                return Rejected("bad_json", str(exc)[:MAX_DETAIL_CHARS])
            if not isinstance(fields, dict):
                return Rejected("bad_json", f"a JSON {type(fields).__name__}, not an object")
            message = _lookup(fields, self._message_path)
            if not isinstance(message, str):
                return Rejected("missing_field", f"no string at {self.settings.message_field!r}")
            text = _valid_utf8(message)
        if "\x00" in text:  # wherever it is: a text log has none (a core dump, a JSON "\u0000")
            return Rejected(
                "binary", f"a NUL byte at character {text.index(chr(0))}: binary data, not a log line"
            )
        line = " ".join(text.rstrip().splitlines())
        if not line.strip():
            return Rejected("empty", "blank message")
        stream = _valid_utf8(self._stream(line, key, fields))
        if fields is not None and self._time_path is not None:
            timestamp = _event_time(_lookup(fields, self._time_path)) or timestamp
        return LogRecord(
            line, stream=stream, source=source, offset=offset, timestamp=timestamp,
            labels=self._labels(line, fields), source_kind=source_kind,
        )  # fmt: skip

    def _labels(self, line: str, fields: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
        """Labels for routing: JSON fields first, then the regex's named groups (sorted by name)."""
        found: dict[str, str] = {}
        if fields is not None:
            for name, path in self._label_paths.items():
                value = _lookup(fields, path)
                if isinstance(value, str | int | float | bool) and value != "":
                    found[name] = _valid_utf8(str(value))[:MAX_LABEL_CHARS]
        if self._label_regex is not None:
            match = self._label_regex.search(line)
            if match is not None:
                for name in self._label_regex.groupindex:
                    value = match.group(name)
                    if value:
                        found.setdefault(name, value[:MAX_LABEL_CHARS])
        return tuple(sorted(found.items()))

    def _stream(self, line: str, key: bytes | None, fields: dict[str, Any] | None) -> str:
        found: Any = None
        match self.settings.stream_key:
            case "message_key" if key:
                found = key.decode("utf-8", errors="replace")
            case "json_field" if fields is not None and self._stream_path is not None:
                found = _lookup(fields, self._stream_path)
                if not isinstance(found, str | int | float | bool):
                    found = None  # an object or list is no stream name (nor worth a deep str())
            case "regex" if self._regex is not None:
                found = search_key(self._regex, line)
        if found is None or found == "":
            return self.settings.default_stream
        return str(found)


def _event_time(value: Any) -> float | None:
    """RFC 3339 text or unix seconds/milliseconds -> unix seconds; None if it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = value / 1000 if value > _MILLIS_AFTER else float(value)
        return seconds if math.isfinite(seconds) and seconds > 0 else None
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    return None


def _valid_utf8(text: str) -> str:
    """`text`, with lone surrogates (JSON may spell them as `\\ud800`) replaced by `?`.

    Everything downstream (RE2, the tokenizer, SQLite) needs encodable text.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _lookup(fields: dict[str, Any], path: list[str]) -> Any:
    node: Any = fields
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class RejectLog:
    """Counts rejects per kind (`logstream_bad_records_total`) and logs the first of each."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(REJECT_KINDS, 0)

    def add(self, rejected: Rejected, **context: Any) -> None:
        self.counts[rejected.kind] = self.counts.get(rejected.kind, 0) + 1
        BAD_RECORDS.labels(kind=rejected.kind).inc()
        if self.counts[rejected.kind] == 1:
            log.warning(
                "bad_record_skipped",
                further_ones_only_counted=True,
                kind=rejected.kind,
                detail=rejected.detail,
                **context,
            )
