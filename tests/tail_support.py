"""Shared pieces of the `logstream tail` tests: the command in a subprocess (piped or
following files, its output collected by threads), and a synthetic log with one incident that
the shared tiny model reliably flags (a `new_template` line, tests/evaluation/test_detection.py).
Waits are bounded; nothing asserts on timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from logstream.evaluation.synth import STREAM_KEY, generate_lines

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
    """A running `logstream tail` whose stdout and stderr lines are collected by threads."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(process.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(process.stderr, self.errors), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(
        self, predicate: Callable[[str], bool], timeout: float = RUN_TIMEOUT, stderr: bool = False
    ) -> str:
        """The first stdout (or stderr) line matching `predicate`, polled until `timeout` (bounded)."""
        lines = self.errors if stderr else self.lines
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            found = next((line for line in list(lines) if predicate(line)), None)
            if found is not None:
                return found
            time.sleep(0.05)
        found = next((line for line in list(lines) if predicate(line)), None)
        assert found is not None, f"no such line; so far: {lines[-5:]}, rc {self.process.poll()}"
        return found

    def append_until_printed(self, path: Path, line: Callable[[int], str], tries: int = 60) -> str:
        """Append `line(k)` for k = 0, 1, ... (one each 2 seconds at most) until tail prints one
        of them; the printed line. For a tail that scores every line (`--threshold 0`): what
        it prints shows it reads the file by then."""
        for k in range(tries):
            append(path, [line(k)])
            marker = line(k).split()[-1]
            try:
                return self.wait_for(lambda printed, m=marker: m in printed, timeout=2.0)
            except AssertionError:
                continue
        raise AssertionError(f"nothing printed after {tries} lines; stderr: {self.errors[-5:]}")

    def interrupt(self) -> tuple[int, str]:
        """SIGINT, then the exit code and stderr (bounded wait)."""
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=RUN_TIMEOUT)
        for reader in self._readers:
            reader.join(10)
        return self.process.returncode, "\n".join(self.errors)


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
            process.wait(timeout=30)


def append(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
