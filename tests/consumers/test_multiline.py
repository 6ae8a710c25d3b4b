"""Multi-line events (logstream/consumers/multiline.py): a stack trace becomes one record.

The traces are written as the JVM (logback) and CPython write them; the records come from
the real parser (`RecordParser`), as files, stdin and Kafka hand them over.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from logstream.consumers.multiline import Joiner, join_batch, join_records, joiner_for
from logstream.consumers.parse import RecordParser
from logstream.records import LogRecord, location
from logstream.settings import InputSettings, MultilineSettings

JAVA = """\
2026-11-20 10:00:01.120 INFO  [main] c.e.orders.Api - GET /orders/7 200 12ms
2026-11-20 10:00:01.332 ERROR [http-nio-8080-exec-3] c.e.orders.Api - order 7 failed
java.lang.IllegalStateException: inventory service returned 503
\tat com.example.orders.InventoryClient.reserve(InventoryClient.java:88)
\tat com.example.orders.OrderService.place(OrderService.java:41)
\tat java.base/java.lang.Thread.run(Thread.java:1583)
Caused by: java.net.SocketTimeoutException: Read timed out
\tat java.base/sun.nio.ch.NioSocketImpl.timedRead(NioSocketImpl.java:288)
\t... 12 more
2026-11-20 10:00:01.410 INFO  [main] c.e.orders.Api - GET /orders/8 200 9ms
Exception in thread "scheduler-1" java.lang.OutOfMemoryError: Java heap space
\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)
2026-11-20 10:00:02.001 INFO  [main] c.e.orders.Api - GET /orders/9 200 8ms
""".splitlines()

PYTHON = """\
2026-11-20 10:00:03,101 INFO app.payments: charge 41 ok
2026-11-20 10:00:03,202 ERROR app.payments: charge 42 failed
Traceback (most recent call last):
  File "/srv/app/payments.py", line 57, in charge
    amount = order["amount"]
KeyError: 'amount'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/app/worker.py", line 12, in run
    charge(order)
app.errors.PaymentError: charge 42: no amount
2026-11-20 10:00:03,303 INFO app.payments: charge 43 ok
""".splitlines()


def records(lines: list[str], **settings: object) -> list[LogRecord]:
    """The lines as the file source hands them on: parsed, numbered, blank lines rejected."""
    parser = RecordParser(InputSettings(**settings))  # type: ignore[arg-type]
    parsed = (
        parser.parse(line.encode(), source="app.log", offset=i, source_kind="file")
        for i, line in enumerate(lines)
    )
    return [r for r in parsed if isinstance(r, LogRecord)]


def joined(lines: list[str], mode: str = "auto", pattern: str | None = None) -> list[LogRecord]:
    """The lines of one stream, joined as `mode` says."""
    joiner = Joiner(MultilineSettings(mode=mode, pattern=pattern))  # type: ignore[arg-type]
    return list(join_records(records(lines, stream_key="none"), joiner))


def span(record: LogRecord) -> list[int]:
    """The 0-based lines a record holds (its offset to its last offset)."""
    first = record.offset or 0
    return list(range(first, (record.last_offset if record.last_offset is not None else first) + 1))


def test_a_java_trace_is_one_record_with_its_line_range() -> None:
    """A logback error with its exception, frames, `Caused by:` and `... 12 more` is one
    record from its message line to its last frame; the lines around it stay as they are."""
    out = joined(JAVA)
    assert [r.line.split("\n")[0] for r in out] == [JAVA[0], JAVA[1], JAVA[9], JAVA[10], JAVA[12]]
    trace = out[1]
    assert trace.line == "\n".join(JAVA[1:9])
    assert location(trace) == "app.log:2-9"


def test_exception_in_thread_starts_its_own_event() -> None:
    """`Exception in thread "..." ...` heads a new event (with its frame), never the tail of
    the line before it."""
    out = joined(JAVA)
    assert out[3].line == "\n".join(JAVA[10:12]) and (out[3].offset, out[3].last_offset) == (10, 11)


def test_a_python_traceback_with_its_chained_exception_is_one_record() -> None:
    """logging.exception's message, its traceback, the chaining sentence (blank lines between are
    skipped as empty), the second traceback and its exception line (`app.errors.PaymentError:
    ...`) are one record; the next log line is not."""
    out = joined(PYTHON)
    assert [r.offset for r in out] == [0, 1, 13]
    assert out[1].line.split("\n")[-1] == "app.errors.PaymentError: charge 42: no amount"
    assert out[1].line.count("Traceback (most recent call last):") == 2 and out[1].last_offset == 12


def test_an_interleaved_trace_joins_only_its_own_streams_lines() -> None:
    """Two services' traces interleaved message by message in one partition (JSON records
    keyed by a `service` field): each service's lines join that service's event only, and
    the normal lines after them stay records of their own."""
    a = [
        "order 7 failed",
        "java.lang.IllegalStateException: boom",
        "\tat com.e.A.run(A.java:1)",
        "\tat com.e.A.main(A.java:9)",
    ]
    b = [
        "charge 42 failed",
        "Traceback (most recent call last):",
        '  File "/srv/p.py", line 5, in f',
        "KeyError: 'amount'",
    ]
    messages = [
        *(pair for k in range(4) for pair in (("orders", a[k]), ("payments", b[k]))),
        ("payments", "charge 43 ok"),
        ("orders", "order 8 ok"),
    ]
    settings = InputSettings(
        format="json",
        stream_key="json_field",
        stream_field="service",
        multiline=MultilineSettings(mode="auto"),
    )
    parser = RecordParser(settings)
    raw = [json.dumps({"service": s, "message": m}).encode() for s, m in messages]
    parsed = [
        parser.parse(value, source="logs/0", offset=i, source_kind="kafka") for i, value in enumerate(raw)
    ]
    out = join_batch([r for r in parsed if isinstance(r, LogRecord)], joiner_for(settings))
    assert [(r.stream, r.line) for r in out] == [
        ("orders", "\n".join(a)),
        ("payments", "\n".join(b)),
        ("payments", "charge 43 ok"),
        ("orders", "order 8 ok"),
    ]
    assert location(out[0]) == "logs/0@0-6" and location(out[1]) == "logs/0@1-7"


def test_frames_without_a_stream_key_continue_the_stream_of_the_line_before() -> None:
    """With a stream key read from the line, a frame that carries no key (it falls to the
    default stream) continues the event of the stream that wrote the line before it."""
    lines = [
        "web-1 ERROR request failed",
        "java.lang.RuntimeException: x",
        "\tat com.e.Y(Y.java:3)",
        "web-2 INFO ok",
    ]
    settings = InputSettings(
        stream_key="regex", stream_regex=r"(web-\d+)", multiline=MultilineSettings(mode="auto")
    )
    out = list(
        join_records(records(lines, stream_key="regex", stream_regex=r"(web-\d+)"), joiner_for(settings))
    )
    assert [(r.stream, r.line) for r in out] == [("web-1", "\n".join(lines[:3])), ("web-2", lines[3])]


def test_an_event_over_max_lines_is_cut_counted_and_the_rest_goes_on() -> None:
    """A trace longer than max_lines is cut there; the cut is counted, and the rest of its
    lines form the next record: no line is lost."""
    lines = ["ERROR boom", *(f"\tat com.e.F.f{i}(F.java:{i})" for i in range(9))]
    joiner = Joiner(MultilineSettings(mode="auto", max_lines=4))
    out = list(join_records(records(lines, stream_key="none"), joiner))
    assert [len(r.line.split("\n")) for r in out] == [4, 4, 2]
    assert "\n".join(r.line for r in out) == "\n".join(lines)
    assert joiner.stats.cut == 2


def test_an_event_over_max_bytes_is_cut() -> None:
    """The byte cap holds too: a frame that would pass max_bytes starts the next record."""
    lines = ["ERROR boom", "\t" + "x" * 40, "\t" + "y" * 40]
    joiner = Joiner(MultilineSettings(mode="auto", max_bytes=60))
    out = list(join_records(records(lines, stream_key="none"), joiner))
    assert [r.line for r in out] == ["\n".join(lines[:2]), lines[2]] and joiner.stats.cut == 1


def test_records_come_out_in_the_order_of_their_first_lines() -> None:
    """An event still open holds back the records of other streams read after it, so records
    leave in the order of their first lines."""
    key = r"\[(\w+)\]"
    settings = InputSettings(stream_key="regex", stream_regex=key, multiline=MultilineSettings(mode="auto"))
    lines = ["[a] ERROR x", "[b] one", "[b] two", "\tat a.Frame.run(Frame.java:3) [a]"]
    out = list(join_records(records(lines, stream_key="regex", stream_regex=key), joiner_for(settings)))
    assert [(r.offset, r.last_offset) for r in out] == [(0, 3), (1, None), (2, None)]


@pytest.mark.parametrize(
    ("mode", "pattern", "expected"),
    [
        ("start", r"^\d{4}-\d\d-\d\d ", [[0], [1, 2, 3], [4]]),
        ("continue", r"^(?:\s|Caused by: )", [[0], [1], [2, 3], [4]]),
    ],
)
def test_a_user_pattern_decides_where_events_start_or_continue(
    mode: str, pattern: str, expected: list[list[int]]
) -> None:
    """`start`: an event begins at each line matching the pattern, every other line continues
    it; `continue`: a line matching it continues the event before."""
    lines = ["2026-11-20 a", "2026-11-20 b", "not indented, no date", " indented", "2026-11-20 c"]
    assert [span(r) for r in joined(lines, mode, pattern)] == expected


def test_a_user_pattern_runs_on_re2() -> None:
    """A pattern RE2 cannot run in linear time (a backreference) is refused at load."""
    with pytest.raises(ValidationError, match="RE2 cannot run it"):
        MultilineSettings(mode="start", pattern=r"^(\w+) \1")


def test_off_leaves_every_line_a_record() -> None:
    """`off` (serve's default for Kafka) joins nothing."""
    assert joiner_for(InputSettings()) is None
    assert len(list(join_records(records(JAVA), None))) == len(JAVA)


def test_a_followed_input_completes_an_event_after_flush_seconds_without_a_line() -> None:
    """Following a file, an event waits for the line after it only `flush_seconds`: then it
    is complete without one."""
    joiner = Joiner(MultilineSettings(mode="auto", flush_seconds=0.5))
    assert joiner.push(LogRecord("ERROR boom", offset=0), now=10.0) == []
    assert joiner.push(LogRecord("\tat a.B.c(B.java:1)", offset=1), now=10.2) == []
    assert joiner.flush(idle_since=10.1) == []  # its last line came after that
    (event,) = joiner.flush(idle_since=10.7)
    assert event.record.line == "ERROR boom\n\tat a.B.c(B.java:1)" and event.members == (0, 1)
