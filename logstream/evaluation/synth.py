"""A seeded synthetic log generator with labeled, injected incidents.

The normal system: web hosts serve requests (status 2xx/3xx), workers run jobs
through a fixed lifecycle (started -> fetch -> transform -> load -> finished),
a monitor sends heartbeats, and caches rarely evict keys (a WARN line, ~1%).

Incident kinds, each a way a language model should be surprised:
- new_template:  a line shape never seen (`ERROR db: connection pool exhausted ...`)
- unseen_value:  a known line with a value never seen (`status=503`)
- broken_order:  a job that jumps from `started` to `finished`, skipping its steps
- burst:         the rare cache-eviction line, many times in a row on one host

The stream of a line is its host (`web-1`, `worker-2`, `monitor-0`); use
`STREAM_KEY` as `--stream-key`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

STREAM_KEY = r"((?:web|worker|monitor)-\d+)"
INCIDENT_KINDS = ("new_template", "unseen_value", "broken_order", "burst")
_START = datetime(2026, 11, 2, 8, 0, 0, tzinfo=UTC)
_RESOURCES = ("orders", "users", "carts", "items", "payments")


@dataclass
class SyntheticLog:
    lines: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)  # 1 = part of an injected incident
    kinds: list[str | None] = field(default_factory=list)  # incident kind per line


class _System:
    """The normal system's state machine; `next_line` emits one (host, body)."""

    def __init__(self, rng: random.Random, web_hosts: int, workers: int) -> None:
        self.rng = rng
        self.web_hosts = web_hosts
        self.job_step = [0] * workers  # lifecycle position of each worker's current job
        self.job_id = [rng.randrange(1000, 9999) for _ in range(workers)]

    def web(self, host: int | None = None, status: int | None = None) -> tuple[str, str]:
        rng = self.rng
        host = rng.randrange(self.web_hosts) if host is None else host
        method, ok = rng.choice((("GET", (200, 200, 200, 304)), ("POST", (201, 200)), ("DELETE", (204,))))
        status = rng.choice(ok) if status is None else status
        body = (
            f"INFO http: {method} /api/{rng.choice(_RESOURCES)}/{rng.randrange(1, 99999)} "
            f"status={status} bytes={rng.randrange(200, 9000)} ms={rng.randrange(1, 80)}"
        )
        return f"web-{host}", body

    def cache_evict(self, host: int) -> tuple[str, str]:
        return (
            f"web-{host}",
            f"WARN cache: evicted {self.rng.randrange(100, 900)} keys under memory pressure",
        )

    def job(self, worker: int, skip_to_end: bool = False) -> tuple[str, str]:
        rng, step = self.rng, self.job_step[worker]
        job = self.job_id[worker]
        if skip_to_end and step > 0:
            step = 4
        body = (
            f"INFO job {job}: started queue=batch",
            f"INFO job {job}: step fetch rows={rng.randrange(1000, 50000)}",
            f"INFO job {job}: step transform partitions={rng.choice((4, 8, 16))}",
            f"INFO job {job}: step load table=events_{rng.choice(('daily', 'hourly'))}",
            f"INFO job {job}: finished in {rng.randrange(2000, 90000)}ms",
        )[step]
        if step == 4:
            self.job_step[worker], self.job_id[worker] = 0, rng.randrange(1000, 9999)
        else:
            self.job_step[worker] = step + 1
        return f"worker-{worker}", body

    def next_line(self) -> tuple[str, str]:
        roll = self.rng.random()
        if roll < 0.55:
            return self.web()
        if roll < 0.56:
            return self.cache_evict(self.rng.randrange(self.web_hosts))
        if roll < 0.95:
            return self.job(self.rng.randrange(len(self.job_step)))
        return "monitor-0", f"INFO heartbeat: ok nodes={self.web_hosts + len(self.job_step)}"


def _incident(system: _System, kind: str) -> list[tuple[str, str, str | None]]:
    """The incident's lines as (host, body, kind); context lines it needs have kind None."""
    rng = system.rng
    if kind == "new_template":
        worker = f"worker-{rng.randrange(len(system.job_step))}"
        pool = f"active={rng.randrange(50, 64)}, waiting={rng.randrange(10, 500)}"
        return [(worker, f"ERROR db: connection pool exhausted ({pool})", kind)]
    if kind == "unseen_value":
        return [(*system.web(status=503), kind)]
    if kind == "broken_order":
        worker = rng.randrange(len(system.job_step))
        lines: list[tuple[str, str, str | None]] = []
        while system.job_step[worker] != 0:  # let the current job finish normally first
            lines.append((*system.job(worker), None))
        lines.append((*system.job(worker), None))  # started
        lines.append((*system.job(worker, skip_to_end=True), kind))  # finished, no steps
        return lines
    if kind == "burst":
        host = rng.randrange(system.web_hosts)
        return [(*system.cache_evict(host), kind) for _ in range(12)]
    raise ValueError(f"unknown incident kind {kind!r}; expected one of {INCIDENT_KINDS}")


def generate_lines(
    n: int,
    seed: int = 0,
    incidents: tuple[str, ...] = (),
    incident_start: float = 0.5,
    web_hosts: int = 3,
    workers: int = 3,
) -> SyntheticLog:
    """`n` normal lines, plus the given incidents spread over the part after `incident_start`.

    Incident lines are labeled 1; the context lines an incident needs (a job
    finishing normally before the broken one) are normal and labeled 0.
    """
    rng = random.Random(seed)
    system = _System(rng, web_hosts, workers)
    first = int(n * incident_start)
    slots = sorted(rng.sample(range(first, max(n, first + 1)), k=len(incidents))) if incidents else []
    due = dict(zip(slots, incidents, strict=True))
    log, clock = SyntheticLog(), _START

    def emit(host: str, body: str, kind: str | None) -> None:
        nonlocal clock
        clock += timedelta(milliseconds=rng.randrange(5, 400))
        log.lines.append(f"{clock.isoformat(timespec='milliseconds')[:-6]}Z {host} {body}")
        log.labels.append(int(kind is not None))
        log.kinds.append(kind)

    for i in range(n):
        if i in due:
            for host, body, kind in _incident(system, due[i]):
                emit(host, body, kind)
        emit(*system.next_line(), None)
    return log


# A release that rewords 3 of the system's 8 templates (37.5% of them, about 17% of the
# lines): the job's fetch and transform steps and the monitor's heartbeat say the same things
# in new words. benchmarks/format_change.py and tests/lifecycle/test_retrain.py simulate a deploy with it.
FORMAT_CHANGE = (
    (re.compile(r"step fetch rows=(\d+)"), r"fetch complete, \1 rows read"),
    (re.compile(r"step transform partitions=(\d+)"), r"transform complete over \1 partitions"),
    (re.compile(r"heartbeat: ok nodes=(\d+)"), r"heartbeat: status=healthy node_count=\1"),
)


def after_format_change(log: SyntheticLog) -> SyntheticLog:
    """The same log as the reworded release writes it (labels and kinds unchanged)."""
    lines = []
    for line in log.lines:
        for pattern, new in FORMAT_CHANGE:
            line = pattern.sub(new, line)
        lines.append(line)
    return SyntheticLog(lines, log.labels, log.kinds)


# Stream-specific context, as real streams carry it (a pod's session, a job id, a user): each
# stream's lines end in `session=<id>`, six letters drawn at random, none of which the masking
# rules touch (no digit, shorter than an `<ID>`). A stream opens a new session every
# SESSION_LINES lines (drawn per session), announced by `INFO session: opened session=<id>`. An id is
# unpredictable until its stream has said it, so a model can only score a stream's lines well
# with the stream's own recent lines in context: benchmarks/rebalance.py's workload.
SESSION_LINES = (20, 60)
_ID_LETTERS = "bcdfghjklmnpqrstvwxz"  # no vowels: no word the model may already half-know


def with_sessions(log: SyntheticLog, seed: int = 0, lines: tuple[int, int] = SESSION_LINES) -> SyntheticLog:
    """The same log where every stream (`STREAM_KEY`) carries a session id on each line and
    opens a new one every `lines` (low, high) of its lines; the `opened` lines are normal
    (label 0, kind None) and share the timestamp of the line they precede."""
    rng = random.Random(seed)
    session: dict[str, tuple[str, int]] = {}  # stream -> (id, lines left in it)
    out = SyntheticLog()
    for line, label, kind in zip(log.lines, log.labels, log.kinds, strict=True):
        stamp, stream, _ = line.split(" ", 2)
        sid, left = session.get(stream, ("", 0))
        if left == 0:
            sid, left = "".join(rng.choices(_ID_LETTERS, k=6)), rng.randint(*lines)
            out.lines.append(f"{stamp} {stream} INFO session: opened session={sid}")
            out.labels.append(0)
            out.kinds.append(None)
        session[stream] = (sid, left - 1)
        out.lines.append(f"{line} session={sid}")
        out.labels.append(label)
        out.kinds.append(kind)
    return out
