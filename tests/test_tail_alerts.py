"""`logstream tail --alerts`: the incident's alert reaches a real webhook receiver on 127.0.0.1
with the log's time, replay's explanation, the template text and short stable labels, and the
past incident of its kind from the incident memory, which tail also prints.

One run of the command (a subprocess on the shared tiny synthetic model, tests/tail_support.py)
serves every test of the module.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from alerts_support import webhook, write_routes
from http_receivers import Receiver
from tail_support import (
    INCIDENT,
    RUN_TIMEOUT,
    append,
    incident_log,
    run_on_stdin,
)

from logstream.alerts.alert import rfc3339
from logstream.evaluation.synth import STREAM_KEY
from logstream.memory.retrieval import IncidentMemory
from logstream.memory.store import Incident
from logstream.text.event_time import line_time

PAST = "logstream-" + "7" * 32  # an earlier incident of the same kind, in the memory already


FIX = "pool size raised to 200 on worker-7"


@dataclass
class Paged:
    lines: list[str]
    alert: dict[str, Any]  # the firing alert about the incident, as the webhook got it
    printed: str  # tail's stdout


@pytest.fixture(scope="module")
def paged(synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Paged:
    """`logstream tail - --alerts ROUTES` on the incident log, delivering to a real webhook
    receiver on 127.0.0.1, with an incident of the same kind (a day ago, on another stream,
    resolved by carol) in the routes' incident memory already."""
    tmp = tmp_path_factory.mktemp("paged")
    lines = incident_log()
    with Receiver() as receiver:
        routes = write_routes(tmp, [webhook("hook", receiver.url)])
        memory = IncidentMemory(tmp / "outbox.sqlite")
        earlier = time.time() - 86400
        line = (
            "2026-11-01T08:01:23.801Z worker-7 ERROR db: connection pool exhausted (active=50, waiting=311)"
        )
        template = "<TS> worker-7 ERROR db: connection pool exhausted (active=<NUM>, waiting=<NUM>)"
        memory.record(
            Incident(PAST, state="resolved", first_seen=earlier, last_seen=earlier, starts_at=earlier,
                     streams=("worker-7",), templates=(template,), examples=(line,))
        )  # fmt: skip
        memory.resolve(PAST, FIX, by="carol")
        memory.close()
        done = run_on_stdin(
            synthetic_model_dir, "".join(x + "\n" for x in lines).encode(), "--alerts", str(routes)
        )
        assert done.returncode == 0, done.stderr.decode()
        firing = [
            alert
            for request in receiver.ok()
            for alert in request.body["alerts"]
            if alert["status"] == "firing" and INCIDENT in json.dumps(alert["annotations"])
        ]
    assert firing, f"no alert about the incident; requests: {len(receiver.requests)}"
    return Paged(lines, firing[0], done.stdout.decode())


def test_alerts_reach_a_webhook(paged: Paged) -> None:
    """With --alerts, the anomaly is routed through the outbox to a real webhook receiver,
    delivered before the run ends, and its alert starts at the log line's own time."""
    lines, alert = paged.lines, paged.alert
    incident = next(x for x in lines if INCIDENT in x)
    assert alert["startsAt"] == rfc3339(line_time(incident) or 0.0)


def test_the_alert_explains_in_replay_s_words(
    paged: Paged, synthetic_model_dir: Path, tmp_path: Path
) -> None:
    """The payload's `explanation` is the sentence `logstream replay` gives the same line with
    the same model (the surprising words and the model's chance of each), not BPE tokens."""
    lines, alert = paged.lines, paged.alert
    path = tmp_path / "app.log"
    append(path, lines)
    scores = tmp_path / "scores.jsonl"
    replayed = subprocess.run(
        [sys.executable, "-m", "logstream", "replay", str(path), "--model", str(synthetic_model_dir),
         "--stream-key", STREAM_KEY, "--out", str(scores), "--json"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    row = next(json.loads(x) for x in scores.read_text().splitlines() if INCIDENT in x)
    annotations = alert["annotations"]
    assert annotations["explanation"] == row["explanation"]["summary"]
    assert "top_tokens" not in annotations


def test_the_alert_carries_the_template_text_and_short_stable_labels(paged: Paged) -> None:
    """The template is in the annotations as text; the labels are short values that stay the same
    for the incident: the template label is a 12-digit hash, and the model version and the
    source (which change with a promote or a partition) are annotations, not labels."""
    alert = paged.alert
    labels, annotations = alert["labels"], alert["annotations"]
    assert INCIDENT in annotations["template"]
    assert re.fullmatch(r"[0-9a-f]{12}", labels["template"])
    assert "model_id" not in labels and "source" not in labels
    assert annotations["model_id"].startswith("model@") and annotations["source"].startswith("stdin:")
    assert max(len(value) for value in labels.values()) <= 16


def test_tail_prints_the_past_incident_under_the_anomaly(paged: Paged) -> None:
    """Under the incident's anomaly tail prints the earlier incident of its kind from the
    memory: when, which, and what carol wrote was done."""
    printed = paged.printed.splitlines()
    at = next(i for i, line in enumerate(printed) if INCIDENT in line and not line.startswith(" "))
    assert printed[at + 1].startswith(f"    seen before: {rfc3339(time.time() - 86400)[:10]}")
    assert PAST in printed[at + 1] and printed[at + 1].endswith(f"resolution: {FIX} (carol)")


def test_the_alert_from_tail_carries_the_past_incident(paged: Paged) -> None:
    """The incident's alert, as the webhook got it from tail, carries the earlier incident and
    its resolution."""
    assert [p["fingerprint"] for p in paged.alert["pastIncidents"]] == [PAST]
    assert paged.alert["annotations"]["past_resolution"] == f"{FIX} (carol)"
