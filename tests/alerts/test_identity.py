"""Incident identity comes from the template text: two processes whose miners numbered the
same template differently still agree on its group key and dedup key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from alerts_support import webhook, write_routes

TESTS = Path(__file__).parents[1]

# One fresh process: an in-memory outbox, one anomaly of `template` under miner id `tid`. Its
# clock is the same in every process: a dedup key carries the second its incident opened.
KEYS_OF = """
import json, sys
sys.path.insert(0, {tests!r})
from dataclasses import replace
from alerts_support import FakeClock, anomaly
from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
config = load_config({routes!r})
outbox = Outbox(":memory:", config, clock=FakeClock())
outbox.put([replace(anomaly(), template_id={tid}, template={template!r})])
(alert,) = outbox.flush()
print(json.dumps({{"template": alert.labels["template"], "dedup_key": alert.dedup_key}}))
"""


def _keys_in_a_new_process(routes: Path, template_id: int, template: str, seed: str) -> dict[str, str]:
    script = KEYS_OF.format(tests=str(TESTS), routes=str(routes), tid=template_id, template=template)
    env = {**os.environ, "PYTHONHASHSEED": seed}  # str hashes differ between the two runs
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_same_template_text_gives_the_same_keys_in_two_processes(tmp_path: Path) -> None:
    """Template ids 3 and 41 (per-process miner counters) for one template text: equal
    template labels and dedup keys in two separate processes."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    text = "ERROR block <*> replica lost on <IP>"
    first = _keys_in_a_new_process(routes, 3, text, seed="1")
    second = _keys_in_a_new_process(routes, 41, text, seed="2")
    assert first == second


def test_different_template_texts_with_one_id_are_different_incidents(tmp_path: Path) -> None:
    """The same miner id (1, as each restarted process numbers its first template) for two
    different template texts: different template labels and dedup keys."""
    routes = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    before = _keys_in_a_new_process(routes, 1, "INFO job <*> started", seed="1")
    after = _keys_in_a_new_process(routes, 1, "ERROR disk <PATH> failed", seed="1")
    assert before["template"] != after["template"]
    assert before["dedup_key"] != after["dedup_key"]
