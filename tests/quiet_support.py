"""Syslog lines of regular sources, for the quiet-source tests (tests/scoring/test_quiet.py,
tests/test_serve.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

START = 1_790_000_000.0  # 2026-09-21, unix s
THRESHOLD = 3.5  # -log10 p, about the default false-alarm rate's


def line(t: float, source: str, message: str = "job done status 0") -> str:
    """A syslog line with an ISO 8601 time: `host program[pid]: message`."""
    host, program = source.split()
    return f"{datetime.fromtimestamp(t, UTC):%Y-%m-%dT%H:%M:%SZ} {host} {program}[42]: {message}"


def rhythm(seed: int, start: float, stop: float, cron: bool = True) -> list[tuple[float, str]]:
    """(time, source) of two regular sources: `web-1 cron` every 5 min (up to 30 s late) and
    `web-1 app` every 5-10 s; `cron=False` leaves the cron job out."""
    rng = random.Random(seed)
    events = []
    t = start
    while cron and t < stop:
        events.append((t + rng.uniform(0, 30), "web-1 cron"))
        t += 300
    t = start
    while t < stop:
        events.append((t, "web-1 app"))
        t += rng.uniform(5, 10)
    return sorted(events)


def stopped_job() -> list[tuple[float, str]]:
    """The cron job stops after 2.5 h (30 runs) while the app logs 1 h more."""
    return sorted(rhythm(1, START, START + 9000) + rhythm(2, START + 9000, START + 12_600, cron=False))


def after_restart(seed: int, start: float) -> list[tuple[float, str]]:
    """From `start`: the cron job runs once, then stops; the app logs for 2 h."""
    return sorted(rhythm(seed, start, start + 300) + rhythm(seed + 1, start + 300, start + 7200, cron=False))


def baseline_lines() -> list[str]:
    """3 h of both sources as they run normally: a model's training lines."""
    return [line(t, source) for t, source in rhythm(0, START, START + 3 * 3600)]
