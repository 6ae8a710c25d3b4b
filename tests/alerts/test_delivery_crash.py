"""kill -9 the delivery worker mid-delivery, restart it: every alert arrives, none is lost,
and nothing the outbox recorded as delivered is sent again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from alerts_support import anomaly, webhook, write_routes
from http_receivers import Receiver, Reply

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox

N_ALERTS = 60


def _worker(routes: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "logstream.alerts",
        "deliver",
        "--alerts",
        str(routes),
        "--until-idle",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_kill_9_during_delivery_loses_nothing(tmp_path: Path) -> None:
    """Killed after ~1/3 of the alerts; on restart all arrive, delivered ones are not resent."""
    slow = Reply(200, delay=0.03)  # keeps several requests in flight when the kill lands
    with Receiver(lambda _r, _n: slow) as receiver:
        routes = write_routes(tmp_path, [webhook("team", receiver.url)], delivery={"concurrency": 4})
        config = load_config(routes)
        outbox = Outbox(config.delivery.outbox, config)
        outbox.put([anomaly(template_id=i) for i in range(N_ALERTS)])
        expected = {a.dedup_key for a in outbox.flush()}
        assert len(expected) == N_ALERTS

        first = _worker(routes)
        assert receiver.wait_for(lambda r: len(r.requests) >= N_ALERTS // 3, timeout=60)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        assert first.returncode == -signal.SIGKILL
        delivered_before_kill = outbox.delivered_keys()
        seen_before_restart = len(receiver.requests)

        second = _worker(routes)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 0, err.decode()[-2000:]

    after_restart = receiver.requests[seen_before_restart:]
    assert outbox.pending() == 0 and outbox.dead_letters() == []
    # every alert arrived
    assert {r.body["groupKey"] for r in receiver.ok()} == expected
    # what the outbox had marked delivered was never sent again
    assert delivered_before_kill
    assert not {r.key for r in after_restart} & delivered_before_kill
    # duplicates are only the sends in flight at the kill (at most `concurrency`), same key
    keys = [r.key for r in receiver.ok()]
    assert len(keys) - len(set(keys)) <= 4
    assert len(set(keys)) == N_ALERTS
