"""`logstream tail`: live scoring of files and stdin in a real process, without Kafka: a growing
file, stdin to EOF, JSON with the event time, bad input, rotation, --once, starting at a
file's end, a model store's promote, escaped lines, stack traces.

Every test runs the command as a subprocess on the shared tiny synthetic model and injects a
`new_template` incident (tests/tail_support.py). Alerts from tail are in
tests/test_tail_alerts.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cli_support import UNSAFE
from tail_support import (
    INCIDENT,
    RUN_TIMEOUT,
    Tailing,
    append,
    incident_log,
    run_on_stdin,
    tail_args,
    tailing,
)

from logstream.engine.model import model_id
from logstream.text.event_time import line_time


def test_growing_file_prints_the_anomaly_and_stops_on_sigint(
    synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """Lines appended to a followed file while tail runs are scored; the injected incident is
    printed; SIGINT ends the run with exit code 0."""
    path = tmp_path / "app.log"
    path.write_text("")
    lines = incident_log()
    with tailing(synthetic_model_dir, str(path), "--from-start") as tail:
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
    with tailing(synthetic_model_dir, str(path), "--json", "--from-start") as tail:
        append(path, first)
        tail.wait_for(lambda line: INCIDENT in line)
        path.rename(tmp_path / "app.log.1")
        novel = "2026-11-02T09:00:00.000Z worker-1 FATAL kernel: watchdog reset the frobnicator quux=7"
        append(path, [*second[:20], novel])
        found = tail.wait_for(lambda line: "frobnicator" in line)
        rc, stderr = tail.interrupt()
    assert json.loads(found)["location"] == f"{path}:21"
    assert rc == 0, stderr


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


def probe(k: int) -> str:
    """A line the model has never seen, ending in a unique word (`probe00007`)."""
    return f"2026-11-02T09:00:{k % 60:02d}.000Z web-1 INFO deploy: canary probe{k:05d}"


@pytest.fixture(scope="module")
def from_the_end(
    synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[str], Tailing, str]:
    """`logstream tail FILE --threshold 0` on a file that already holds 300 lines (an incident
    among them), then probes appended until one is printed: (path, the file's lines, the
    finished run, the printed probe). At threshold 0 every scored line is printed."""
    path = tmp_path_factory.mktemp("tail-end") / "app.log"
    history = incident_log()
    append(path, history)
    with tailing(synthetic_model_dir, str(path), "--threshold", "0") as tail:
        tail.wait_for(lambda line: line.startswith("tail: following"), stderr=True)
        printed = tail.append_until_printed(path, probe)
        rc, _ = tail.interrupt()
    assert rc == 0, tail.errors
    return path, history, tail, printed


def test_tail_starts_at_the_end_of_a_file(from_the_end: tuple[Path, list[str], Tailing, str]) -> None:
    """Without --from-start tail scores only what is written after it started, as tail -F:
    none of the file's 300 earlier lines (its incident included) is printed."""
    path, history, tail, _ = from_the_end
    numbers = [
        int(m.group(1)) for line in tail.lines if (m := re.search(rf"{re.escape(str(path))}:(\d+)", line))
    ]
    assert numbers and min(numbers) > len(history)
    assert not any(INCIDENT in line for line in tail.lines)


def test_tail_numbers_lines_from_the_end_as_the_file_does(
    from_the_end: tuple[Path, list[str], Tailing, str],
) -> None:
    """Started at the end, tail still names a line by its number in the file."""
    path, _, _, printed = from_the_end
    lines = path.read_text().splitlines()
    marker = printed.split()[-1]
    number = next(i for i, line in enumerate(lines, start=1) if line.endswith(marker))
    assert f"{path}:{number}:" in printed


def test_tail_says_what_it_follows_with_which_model_and_threshold(
    from_the_end: tuple[Path, list[str], Tailing, str], synthetic_model_dir: Path
) -> None:
    """The start line on stderr names the input and where it starts, the model and its version,
    and the threshold."""
    path, _, tail, _ = from_the_end
    start = next(line for line in tail.errors if line.startswith("tail: following"))
    meta = json.loads((synthetic_model_dir / "logstream.json").read_text())
    assert f"{path} (from its end; --from-start reads it all)" in start
    assert (
        f"model {synthetic_model_dir} ({model_id(synthetic_model_dir)}, trained {meta['created_at']})"
        in start
    )
    assert "alerts above score 0.00" in start


def test_from_start_reads_what_the_file_holds(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """--from-start scores the file's lines from its first: the incident already in it is printed."""
    path = tmp_path / "app.log"
    lines = incident_log()
    append(path, lines)
    with tailing(synthetic_model_dir, str(path), "--from-start") as tail:
        printed = tail.wait_for(lambda line: INCIDENT in line)
        rc, _ = tail.interrupt()
    assert rc == 0 and f"{path}:{lines.index(next(x for x in lines if INCIDENT in x)) + 1}" in printed


def test_tail_follows_a_model_store_through_a_promote(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """--model STORE scores with the live version, names it at start, and switches to the next
    live version when `models promote` changes it, without a restart."""
    from logstream.lifecycle import model_store

    store = tmp_path / "store"
    first = model_store.add(store, synthetic_model_dir)
    second = model_store.add(store, synthetic_model_dir)
    model_store.promote(store, first)
    path = tmp_path / "app.log"
    path.write_text("")
    with tailing(store, str(path), "--json", "--threshold", "0") as tail:
        start = tail.wait_for(lambda line: line.startswith("tail: following"), stderr=True)
        assert f"model store {store}, live version {first}" in start
        assert json.loads(tail.append_until_printed(path, probe))["model_id"].startswith(f"{first}@")
        model_store.promote(store, second)
        ids = []
        for k in range(30):  # the store is polled every 5 s: a probe a second sees the switch
            printed = tail.append_until_printed(path, lambda j, k=k: probe(100 + 60 * k + j))
            ids.append(json.loads(printed)["model_id"])
            if ids[-1].startswith(f"{second}@"):
                break
        rc, _ = tail.interrupt()
    assert rc == 0 and ids[-1].startswith(f"{second}@")


HOSTILE = [
    "2026-11-02T09:00:00.000Z web-1 ERROR \x1b]0;you have been pwned\x07 title set",
    "2026-11-02T09:00:01.000Z web-1 ERROR \x1b[2J\x1b[H screen cleared",
    "2026-11-02T09:00:02.000Z web-1 ERROR \x1b]8;;http://evil.example/\x1b\\click here\x1b]8;;\x1b\\ to log in",
]


def test_tail_escapes_control_sequences_from_log_lines(synthetic_model_dir: Path) -> None:
    """Lines carrying a window-title, a screen-clear and a disguised-link sequence are printed
    with the sequences escaped: stdout holds no control character a terminal would obey."""
    data = "".join(x + "\n" for x in [*incident_log(n=40), *HOSTILE]).encode()
    done = run_on_stdin(synthetic_model_dir, data, "--threshold", "0")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert UNSAFE.search(out) is None
    assert "\\x1b]0;you have been pwned\\x07" in out and "\\x1b[2J" in out and "\\x1b]8;;http" in out


TRACE = [
    "2026-11-02T09:00:05.000Z worker-1 ERROR job 8629: failed queue=batch",
    "java.lang.IllegalStateException: inventory service returned 503",
    "\tat com.example.orders.InventoryClient.reserve(InventoryClient.java:88)",
    "Caused by: java.net.SocketTimeoutException: Read timed out",
    "\t... 12 more",
]


def test_tail_prints_a_stack_trace_as_one_anomaly(synthetic_model_dir: Path) -> None:
    """A trace under the error line that logged it is scored once: one anomaly, located at
    the range of its lines, its frames printed indented under its first line."""
    before = incident_log(n=40)
    lines = [*before, *TRACE, incident_log(seed=9, n=1)[0]]
    done = run_on_stdin(synthetic_model_dir, "".join(x + "\n" for x in lines).encode(), "--threshold", "0")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    head = next(i for i, line in enumerate(out) if line.endswith(TRACE[0]))
    assert f"stdin:{len(before) + 1}-{len(before) + len(TRACE)}: {TRACE[0]}" in out[head]
    assert out[head + 1 : head + len(TRACE)] == [f"    {line}" for line in TRACE[1:]]
    assert "1 multi-line events of 5 lines (0 cut)" in done.stderr.decode()
