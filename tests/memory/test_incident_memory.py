"""The incident memory (logstream.memory): alert groups kept in the outbox's SQLite file,
bounded; the past incidents most like a new one, with what operators said and did; and
`logstream incidents search|show|resolve` over a real file."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from alerts_support import FakeClock, anomaly, webhook, write_routes

from logstream.alerts.config import load_config
from logstream.alerts.grouping import Group
from logstream.alerts.outbox import Outbox, find_incident
from logstream.evaluation.injection import KINDS, incident
from logstream.lifecycle.feedback import Feedback, FeedbackStore
from logstream.memory.embedding import LineEmbedder
from logstream.memory.retrieval import COMPACT_AT, IncidentIndex, IncidentMemory, text_words
from logstream.memory.settings import IncidentMemorySettings
from logstream.memory.store import (
    MAX_TEMPLATES,
    MAX_TEXT,
    Embedding,
    Incident,
    IncidentError,
    merged,
    observed,
)
from logstream.records import Anomaly
from logstream.text.normalize import Normalizer

DAY = 86400.0
DISK_FULL = "ERROR <TS> storage: Failed to write <PATH>: No space left on device"
OOM = "CRITICAL <TS> kernel: Out of memory: Kill process <NUM> (java) score <NUM> or sacrifice child"
AUTH = "WARN <TS> sshd[<NUM>]: Failed password for invalid user <*> from <IP> port <NUM> ssh2"


class Pager:
    """Real alert groups: anomalies put into a real outbox and flushed, as the pipeline does."""

    def __init__(self, tmp_path: Path) -> None:
        self.routes = write_routes(tmp_path, [webhook("hook", "http://127.0.0.1:9")])
        self.clock = FakeClock()
        config = load_config(self.routes, secrets=False)
        self.outbox = Outbox(config.delivery.outbox, config, clock=self.clock)
        self.path = Path(self.outbox.path)

    def page(self, stream: str, template: str, line: str) -> tuple[Group, Anomaly]:
        """One anomaly, notified: its group as the outbox holds it, and the anomaly."""
        found = replace(anomaly(stream=stream), template=template, line=line)
        self.outbox.put([found])
        alerts = self.outbox.flush(self.clock.now + 1)  # earlier groups' resolves too
        alert = next(a for a in alerts if a.status == "firing" and a.labels["stream"] == stream)
        with closing(sqlite3.connect(self.path)) as db:
            group = find_incident(db, alert.dedup_key)
        assert group is not None
        return group, found


@pytest.fixture
def pager(tmp_path: Path) -> Iterator[Pager]:
    made = Pager(tmp_path)
    yield made
    made.outbox.close()


def test_a_resolution_written_between_two_pages_comes_with_the_second(pager: Pager) -> None:
    """The same kind of incident paged twice, with a resolution written in between: the second
    one's lookup returns the first, first, carrying that resolution; a less alike one ranks
    below it, and one with nothing in common is not returned."""
    memory = IncidentMemory(pager.path)
    memory.record(observed(*pager.page("prod-db", OOM, "kernel: Out of memory: Kill process 811 (java)")))
    auth = memory.record(
        observed(*pager.page("prod-ssh", AUTH, "sshd[9]: Failed password for invalid user x"))
    )
    pager.clock.advance(DAY)
    disk = "storage: Failed to write /var/lib/a/seg-1.log: No space left"
    first = memory.record(observed(*pager.page("prod-api", DISK_FULL, disk)))
    memory.resolve(first.fingerprint, "the backup job filled /var; moved it to /backup", by="alice")
    pager.clock.advance(7 * DAY)
    second = memory.record(observed(*pager.page("prod-web", DISK_FULL, disk.replace("a/seg-1", "b/seg-9"))))
    found = memory.similar(second.fingerprint)
    assert [p.incident.fingerprint for p in found] == [first.fingerprint, auth.fingerprint]
    assert found[0].incident.resolution == "the backup job filled /var; moved it to /backup"
    assert found[0].to_json()["resolved_by"] == "alice"
    memory.close()


def test_verdicts_given_by_fingerprint_come_with_the_incident(pager: Pager) -> None:
    """A `logstream feedback` verdict naming an incident's fingerprint, and one attached through
    the memory after the outbox reused the group for a newer incident, both come back with it."""
    memory = IncidentMemory(pager.path, IncidentMemorySettings(k=5))
    group, found = pager.page("prod-api", DISK_FULL, "storage: Failed to write /var/x: No space left")
    kept = memory.record(observed(group, found))
    given = _logstream(["feedback", "anomaly", "--db", pager.path, "--fingerprint", kept.fingerprint,
                        "-c", "real: disk filled by backup"])  # fmt: skip
    assert given.returncode == 0, given.stderr
    pager.clock.advance(DAY)  # the group resolves; its next anomaly opens a new incident in the same row
    pager.outbox.flush(pager.clock.now)
    later = memory.record(
        observed(*pager.page("prod-api", DISK_FULL, "storage: Failed to write /var/y: No space"))
    )
    assert later.fingerprint != kept.fingerprint
    memory.attach_verdict(kept.fingerprint, "anomaly", "second look: same backup job", by="bob")
    (past,) = memory.similar(later.fingerprint)
    assert past.incident.fingerprint == kept.fingerprint
    assert [(f.verdict, f.comment) for f in past.verdicts] == [
        ("anomaly", "real: disk filled by backup"),
        ("anomaly", "second look: same backup job"),
    ]
    memory.close()


def test_only_verdicts_in_force_on_the_incidents_streams_come_with_it(tmp_path: Path) -> None:
    """Of the rules covering an incident's template, a past incident carries those in force
    now whose stream glob takes one of its streams: not one that expired, not one a newer
    verdict on the same template and scope replaced, not one scoped to other streams."""
    clock = FakeClock()
    path = tmp_path / "o.sqlite"
    memory = IncidentMemory(path, IncidentMemorySettings(k=1), clock=clock)
    memory.record(Incident("past", first_seen=1.0, streams=("prod-api",), templates=(DISK_FULL,)))
    memory.record(Incident("now", first_seen=2.0, streams=("prod-api",), templates=(DISK_FULL,)))
    store = FeedbackStore(path)
    hour = 3600.0
    expired = Feedback("normal", DISK_FULL, comment="during the migration", expires_at=clock.now - hour)
    store.add(expired, now=clock.now - 2 * hour)
    store.add(Feedback("normal", DISK_FULL, comment="deploy noise"), now=clock.now - hour)
    store.add(Feedback("anomaly", DISK_FULL, comment="real: disk filled by the backup job"), now=clock.now)
    store.add(Feedback("normal", DISK_FULL, stream="prod-db*", comment="db volume"), now=clock.now)
    store.add(Feedback("anomaly", DISK_FULL, stream="prod-a*", comment="api volume"), now=clock.now)
    (past,) = memory.similar("now")
    assert [f.comment for f in past.verdicts] == ["real: disk filled by the backup job", "api volume"]
    memory.close()


def test_the_same_kind_ranks_first_among_incidents_of_every_kind() -> None:
    """Two incidents of each kind (different services, hosts, values), worded as syslog
    daemons word them: each second one finds its own kind's first one on top."""
    rng, normalizer = random.Random(3), Normalizer()
    index, settings = IncidentIndex(), IncidentMemorySettings(k=1)
    order = [*KINDS, *KINDS]
    for n, kind in enumerate(order):
        lines = [
            normalizer.mask(f"{source}: {message}") for _, source, message in incident(kind, "system", rng)
        ]
        templates = tuple(dict.fromkeys(lines))[:MAX_TEMPLATES]
        if n >= len(KINDS):
            (top,) = index.nearest(text_words(templates), None, settings)
            assert order[int(top[0])] == kind
        index.add(Incident(str(n), first_seen=float(n), templates=templates))


def test_stream_bias_ranks_an_incident_of_the_same_stream_higher(tmp_path: Path) -> None:
    """With `stream_bias`, a less alike incident of the query's own stream ranks above a more
    alike one of another stream."""
    memory = IncidentMemory(tmp_path / "o.sqlite", IncidentMemorySettings(stream_bias=0.3))
    memory.record(Incident("same-stream", first_seen=1.0, streams=("db",), templates=("write failed: disk",)))
    memory.record(Incident("other", first_seen=2.0, streams=("api",), templates=("write failed: disk full",)))
    memory.record(Incident("query", first_seen=3.0, streams=("db",), templates=("write failed: disk full",)))
    assert [p.incident.fingerprint for p in memory.similar("query")] == ["same-stream", "other"]
    memory.close()


def test_memory_and_disk_stay_bounded_past_the_cap(tmp_path: Path) -> None:
    """Far more incidents than `max_incidents`, through a real SQLite file: the rows stay at
    the cap, the index's arrays within twice its live rows plus the rebuild slack, and the
    file stops growing (SQLite reuses the pages of evicted rows)."""
    cap, path = 50, tmp_path / "outbox.sqlite"
    memory = IncidentMemory(path, IncidentMemorySettings(max_incidents=cap))
    rng = np.random.default_rng(0)
    sizes = {}
    for n in range(3 * COMPACT_AT):
        seen = Incident(
            f"logstream-{n:032x}", state="resolved", first_seen=float(n), last_seen=float(n),
            templates=(f"ERROR job {n} failed: {'x' * 400}",), examples=("y" * 800,), streams=(f"s{n}",),
        )  # fmt: skip
        memory.record(seen, Embedding("model", rng.standard_normal(64).astype(np.float32)))
        if n + 1 in (4 * cap, 3 * COMPACT_AT):
            sizes[n + 1] = path.stat().st_size
    assert memory.store.count() == cap and len(memory.index) == cap
    assert memory.index.capacity <= 2 * (cap + COMPACT_AT)
    assert sizes[3 * COMPACT_AT] <= 1.25 * sizes[4 * cap]
    memory.close()


def test_retention_deletes_incidents_not_seen_for_the_period(tmp_path: Path) -> None:
    """`prune` deletes what was last seen longer than `retention` ago, from the file and the
    index; what was seen since stays."""
    clock = FakeClock()
    memory = IncidentMemory(tmp_path / "o.sqlite", IncidentMemorySettings(retention=30 * DAY), clock=clock)
    memory.record(Incident("old", last_seen=clock.now - 31 * DAY, templates=(DISK_FULL,)))
    memory.record(Incident("recent", last_seen=clock.now - 29 * DAY, templates=(DISK_FULL,)))
    assert memory.prune() == 1
    assert [i.fingerprint for i in memory.store.all()] == ["recent"]
    assert [p.incident.fingerprint for p in memory.search([DISK_FULL])] == ["recent"]
    memory.close()


def test_the_cap_evicts_closed_incidents_without_a_resolution_first(tmp_path: Path) -> None:
    """Past the cap the oldest closed incident without a resolution goes first, even when a
    closed one with a resolution or an open one is older."""
    memory = IncidentMemory(tmp_path / "o.sqlite", IncidentMemorySettings(max_incidents=3))
    memory.record(Incident("open", state="firing", last_seen=1.0, templates=(OOM,)))
    memory.record(Incident("noted", state="resolved", last_seen=2.0, templates=(OOM,)))
    memory.resolve("noted", "added swap")
    memory.record(Incident("closed", state="resolved", last_seen=3.0, templates=(OOM,)))
    memory.record(Incident("newest", state="resolved", last_seen=4.0, templates=(OOM,)))
    assert sorted(i.fingerprint for i in memory.store.all()) == ["newest", "noted", "open"]
    memory.close()


def test_what_an_incident_keeps_is_bounded() -> None:
    """Templates, streams and examples are kept up to their counts and MAX_TEXT characters;
    a vector of the wrong shape is refused; a second model's vector is not averaged in."""
    seen = Incident("f", templates=tuple(f"t{i} {'z' * 2 * MAX_TEXT}" for i in range(40)))
    kept = merged(None, seen, Embedding("a", np.ones(4, np.float32)))
    assert len(kept.templates) == MAX_TEMPLATES and all(len(t) == MAX_TEXT for t in kept.templates)
    again = merged(kept, seen, Embedding("b", np.zeros(4, np.float32)))
    assert again.embedded == 1 and again.embedding is not None and again.embedding.space == "a"
    with pytest.raises(IncidentError, match="embedding: shape"):
        merged(None, seen, Embedding("a", np.ones((2, 2), np.float32)))


def _logstream(args: list[str | Path]) -> subprocess.CompletedProcess[str]:
    """The real command line, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "logstream.cli", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _incidents(args: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return _logstream(["incidents", *args])


def test_cli_searches_shows_and_resolves_over_the_outbox(pager: Pager) -> None:
    """`incidents search` finds a kept incident by words of its line, `resolve -m` writes what
    was done, `show` and a later search carry it; a bad fingerprint is one line, exit 2."""
    memory = IncidentMemory(pager.path)
    kept = memory.record(
        observed(*pager.page("prod-api", DISK_FULL, "storage: Failed to write /v/a: No space left"))
    )
    memory.record(observed(*pager.page("prod-db", OOM, "kernel: Out of memory: Kill process 77 (java)")))
    memory.close()
    found = _incidents(["search", "No space left on device", "--alerts", pager.routes])
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0].split()[1] == kept.fingerprint
    done = _incidents(["resolve", kept.fingerprint, "-m", "rotated the backup volume", "--by", "carol",
                       "--outbox", pager.path])  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = _incidents(["show", kept.fingerprint, "--alerts", pager.routes])
    assert "resolution: rotated the backup volume (carol," in shown.stdout
    again = _incidents(["search", "storage: Failed to write", "--outbox", pager.path, "--json"])
    assert json.loads(again.stdout.splitlines()[0])["resolution"] == "rotated the backup volume"
    bad = _incidents(["resolve", "logstream-nope", "-m", "x", "--outbox", pager.path])
    assert (
        bad.returncode == 2
        and bad.stderr == f"error: fingerprint logstream-nope: no such incident in {pager.path}\n"
    )


def test_cli_search_with_the_model_compares_its_embedding(synthetic_model_dir: Path, pager: Pager) -> None:
    """With `--model`, a search embeds its text with that model and compares it with the
    incidents' vectors of the same model: a kept line searched for is its own nearest
    neighbour at cosine 1."""
    embedder = LineEmbedder.load(synthetic_model_dir)
    line = "2026-11-02 08:00:01 web-1 ERROR db: connection pool exhausted after 5000ms"
    kept = memory_with(pager, embedder, line)
    found = _incidents(["search", line, "--outbox", pager.path, "--model", synthetic_model_dir, "--json"])
    assert found.returncode == 0, found.stderr
    top = json.loads(found.stdout.splitlines()[0])
    assert top["fingerprint"] == kept.fingerprint and top["embedding_similarity"] == pytest.approx(
        1.0, abs=1e-5
    )


def memory_with(pager: Pager, embedder: LineEmbedder, line: str) -> Incident:
    """A memory with one incident of `line`, embedded by `embedder`, and an unlike one."""
    memory = IncidentMemory(pager.path)
    kept = None
    for text in (line, "2026-11-02 08:00:02 worker-2 INFO job 17 done in 3ms"):
        group, found = pager.page(text.split()[2], embedder.normalizer.mask(text), text)
        recorded = memory.record(observed(group, found), embedder.embed_incident([text]))
        kept = kept or recorded
    memory.close()
    assert kept is not None
    return kept
