"""`logstream tail`: live scoring of files and stdin in a real process, without Kafka.

Every test runs the command as a subprocess on the shared tiny synthetic model and
injects a `new_template` incident (a line shape never seen, which the model reliably
flags, see test_detection.py). Waits are bounded; nothing asserts on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alerts_support import webhook, write_routes
from http_receivers import Receiver

from logstream.alerts.alert import rfc3339
from logstream.event_time import line_time
from logstream.synth import STREAM_KEY, generate_lines

INCIDENT = "connection pool exhausted"  # the synthetic new_template incident's text
RUN_TIMEOUT = 180.0  # seconds: a cold start loads torch and the model on a busy 2-core CPU


def incident_log(seed: int = 5, n: int = 300) -> list[str]:
    """`n` normal synthetic lines with one new_template incident in their second half."""
    log = generate_lines(n, seed=seed, incidents=("new_template",))
    assert sum(INCIDENT in line for line in log.lines) == 1
    return log.lines


def tail_args(model: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "logstream",
        "tail",
        *args,
        "--model",
        str(model),
        "--stream-key",
        STREAM_KEY,
    ]


def run_on_stdin(model: Path, data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`logstream tail -` with `data` piped in: EOF ends the run."""
    return subprocess.run(
        tail_args(model, "-", *args), input=data, capture_output=True, timeout=RUN_TIMEOUT, check=False
    )


class Tailing:
    """A running `logstream tail` whose stdout lines are collected by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = RUN_TIMEOUT) -> str:
        """The first stdout line matching `predicate`, polled until `timeout` (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            found = next((line for line in list(self.lines) if predicate(line)), None)
            if found is not None:
                return found
            time.sleep(0.05)
        found = next((line for line in list(self.lines) if predicate(line)), None)
        assert found is not None, f"no such line; stdout so far: {self.lines[-5:]}, rc {self.process.poll()}"
        return found

    def interrupt(self) -> tuple[int, str]:
        """SIGINT, then the exit code and stderr (bounded wait)."""
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=RUN_TIMEOUT)
        self._reader.join(10)
        return self.process.returncode, stderr


@contextmanager
def tailing(model: Path, *args: str) -> Iterator[Tailing]:
    process = subprocess.Popen(
        tail_args(model, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        yield Tailing(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def append(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))


def test_growing_file_prints_the_anomaly_and_stops_on_sigint(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Lines appended to a followed file while tail runs are scored; the injected incident is
    printed; SIGINT ends the run with exit code 0."""
    path = tmp_path / "app.log"
    path.write_text("")
    lines = incident_log()
    with tailing(synthetic_model_dir, str(path)) as tail:
        append(path, lines[:100])
        append(path, lines[100:])
        printed = tail.wait_for(lambda line: INCIDENT in line)
        rc, stderr = tail.interrupt()
    assert f"{path}:{lines.index(next(x for x in lines if INCIDENT in x)) + 1}" in printed
    assert rc == 0, stderr
    assert "tail: " in stderr and "lines scored" in stderr


def test_stdin_is_scored_until_eof(synthetic_model_dir: Path) -> None:
    """`tail -` reads piped lines; EOF ends the run (exit 0) after the anomaly was printed."""
    lines = incident_log()
    done = run_on_stdin(synthetic_model_dir, "".join(x + "\n" for x in lines).encode())
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert INCIDENT in out
    assert f"tail: {len(lines)} lines scored" in done.stderr.decode()


def test_json_output_carries_the_event_time(synthetic_model_dir: Path) -> None:
    """--json prints one JSON object per anomaly; its event_time is the line's own timestamp."""
    lines = incident_log()
    done = run_on_stdin(synthetic_model_dir, "".join(x + "\n" for x in lines).encode(), "--json")
    assert done.returncode == 0, done.stderr.decode()
    anomalies = [json.loads(line) for line in done.stdout.decode().splitlines()]
    incident = next(a for a in anomalies if INCIDENT in a["line"])
    assert incident["event_time"] == line_time(incident["line"])
    assert incident["location"] == f"stdin:{lines.index(incident['line']) + 1}"


def test_bad_input_is_counted_and_skipped(synthetic_model_dir: Path) -> None:
    """Undecodable and oversized lines are counted as rejects, the rest is still scored."""
    lines = incident_log()
    good = "".join(x + "\n" for x in lines).encode()
    bad = b"\xff\xfe not utf-8\n" + b"x" * 70_000 + b"\n"
    done = run_on_stdin(synthetic_model_dir, bad + good)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert INCIDENT in done.stdout.decode()
    assert "undecodable=1" in stderr and "oversized=1" in stderr
    assert f"tail: {len(lines)} lines scored" in stderr


def test_rotated_file_keeps_being_followed(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """After the followed file is renamed and recreated, the new file's lines are scored
    from its start: an incident in it is printed with its line number in the new file."""
    path = tmp_path / "app.log"
    first, second = incident_log(seed=5), incident_log(seed=6)
    path.write_text("")
    with tailing(synthetic_model_dir, str(path), "--json") as tail:
        append(path, first)
        tail.wait_for(lambda line: INCIDENT in line)
        path.rename(tmp_path / "app.log.1")
        novel = "2026-11-02T09:00:00.000Z worker-1 FATAL kernel: watchdog reset the frobnicator quux=7"
        append(path, [*second[:20], novel])
        found = tail.wait_for(lambda line: "frobnicator" in line)
        rc, stderr = tail.interrupt()
    assert json.loads(found)["location"] == f"{path}:21"
    assert rc == 0, stderr


def test_alerts_reach_a_webhook(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """With --alerts, the anomaly is routed through the outbox to a real webhook receiver,
    delivered before the run ends, and its alert starts at the log line's own time."""
    lines = incident_log()
    incident = next(x for x in lines if INCIDENT in x)
    with Receiver() as receiver:
        routes = write_routes(tmp_path, [webhook("hook", receiver.url)])
        done = run_on_stdin(
            synthetic_model_dir, "".join(x + "\n" for x in lines).encode(), "--alerts", str(routes)
        )
        assert done.returncode == 0, done.stderr.decode()
        firing = [
            alert
            for request in receiver.ok()
            for alert in request.body["alerts"]
            if INCIDENT in json.dumps(alert["annotations"])
        ]
    assert firing, f"no alert about the incident; requests: {len(receiver.requests)}"
    assert firing[0]["startsAt"] == rfc3339(line_time(incident) or 0.0)


def test_once_reads_files_to_their_end_and_exits(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """--once reads every file to its end, then exits 0 without a signal."""
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    append(first, incident_log(seed=5))
    append(second, incident_log(seed=6, n=50))
    done = subprocess.run(
        tail_args(synthetic_model_dir, str(first), str(second), "--once"),
        capture_output=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert f"{first}:" in done.stdout.decode() and INCIDENT in done.stdout.decode()
    assert f"tail: {301 + 51} lines scored" in done.stderr.decode()
