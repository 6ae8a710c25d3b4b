"""A real Prometheus Alertmanager for the tests, on a free 127.0.0.1 port.

The binary comes from Debian's `prometheus-alertmanager` package, unpacked by
`.ci/alertmanager.sh` into `.cache/alertmanager/bin` (nothing installed
system-wide; it runs in `.cache/alertmanager`, whose `tmpl/` holds the default
notification template that Debian's build looks for). `AlertmanagerServer` writes a minimal config (one receiver that
sends nowhere), runs the binary in its own process group with clustering off,
waits (bounded) for `/-/ready`, and stops it with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from kafka_broker import free_port, stop_process_group

REPO = Path(__file__).resolve().parents[1]
BINARY = REPO / ".cache" / "alertmanager" / "bin" / "alertmanager"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

# Alertmanager needs a route and a receiver; this one notifies nobody (its API is what we read).
CONFIG = """\
route:
  receiver: nowhere
  group_wait: 1h
receivers:
  - name: nowhere
"""


class AlertmanagerError(RuntimeError):
    """Alertmanager did not start or stop within its bounded wait."""


class AlertmanagerServer:
    """One Alertmanager whose config, data and log live under `work_dir`."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = work_dir / "alertmanager.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.work_dir / "alertmanager.yml"
        config.write_text(CONFIG, encoding="utf-8")
        command = [
            str(BINARY),
            f"--config.file={config}",
            f"--storage.path={self.work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip port: a single, loopback-only instance
        ]
        with self.log_path.open("wb") as log:
            # cwd: the folder whose tmpl/ holds the default template (see .ci/alertmanager.sh)
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=BINARY.parents[1]
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise AlertmanagerError(f"alertmanager exited: {self.log_path.read_text()[-2000:]}")
            if self._ready():
                return
            time.sleep(0.1)
        self.stop()
        raise AlertmanagerError(f"alertmanager not ready within {START_TIMEOUT_S:.0f}s")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: the alerts Alertmanager holds as active (not resolved)."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_process_group(process, STOP_TIMEOUT_S)
