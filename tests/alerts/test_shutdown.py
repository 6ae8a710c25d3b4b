"""SIGTERM keeps alerts: a group still inside `group_wait` is notified on close, delivered
within the grace if the receiver answers, else left in the outbox for the next process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from alerts_support import webhook, write_routes
from http_receivers import Receiver, free_port

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox

TESTS = Path(__file__).parents[1]

# Owns an AlertSink like serve does: SIGTERM sets an event, then the sink is closed.
SINK_PROCESS = """
import signal, sys, threading
sys.path.insert(0, {tests!r})
from alerts_support import anomaly
from logstream.alerts.config import load_config
from logstream.alerts.pipeline import AlertSink
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
sink = AlertSink(load_config({routes!r}))
sink.put([anomaly()])
print("ready", flush=True)
stop.wait(120)
sink.close()
print("closed", flush=True)
"""


def _routes(tmp_path: Path, url: str, grace: str) -> Path:
    """One receiver; a group_wait of an hour, so only the shutdown flush can notify in time."""
    return write_routes(
        tmp_path,
        [webhook("team", url)],
        route={"group_wait": "1h"},
        delivery={"shutdown_grace": grace},
    )


def _sigterm_after_put(routes: Path) -> subprocess.CompletedProcess[str]:
    """Start the sink process, wait until its anomaly is put, SIGTERM it, wait for exit."""
    script = SINK_PROCESS.format(tests=str(TESTS), routes=str(routes))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "ready\n" + out, err)


def test_sigterm_notifies_the_pending_group_before_exit(tmp_path: Path) -> None:
    """A group 1 h from its first notification is delivered during close, before the
    process exits; nothing is left pending."""
    with Receiver() as receiver:
        routes = _routes(tmp_path, receiver.url, grace="60s")
        done = _sigterm_after_put(routes)
        arrived = [r.body["status"] for r in receiver.ok()]
    assert done.returncode == 0 and done.stdout.endswith("closed\n"), done.stderr[-2000:]
    assert arrived == ["firing"]
    config = load_config(routes)
    assert Outbox(config.delivery.outbox, config).pending() == 0


def test_undelivered_at_sigterm_is_delivered_by_the_next_process(tmp_path: Path) -> None:
    """Receiver down during the grace: the notification stays in the outbox; the next
    process on the same outbox (`deliver --until-idle`) delivers it once the receiver is up."""
    port = free_port()
    routes = _routes(tmp_path, f"http://127.0.0.1:{port}", grace="500ms")
    done = _sigterm_after_put(routes)
    assert done.returncode == 0 and done.stdout.endswith("closed\n"), done.stderr[-2000:]
    config = load_config(routes)
    assert Outbox(config.delivery.outbox, config).pending() == 1
    with Receiver(port=port) as receiver:
        cmd = [sys.executable, "-m", "logstream.alerts", "deliver", "--alerts", str(routes), "--until-idle"]
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        arrived = [(r.body["status"], r.body["alerts"][0]["annotations"]["count"]) for r in receiver.ok()]
    assert second.returncode == 0, second.stderr[-2000:]
    assert arrived == [("firing", "1")]
