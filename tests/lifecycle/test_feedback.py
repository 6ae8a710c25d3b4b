"""Operator feedback (logstream.lifecycle.feedback): stored with who/when/why, obeyed at scoring time at
once and after a restart, shared through the database, resolved from what an operator has at
hand (a fingerprint, a path:line), and never in the way of scoring: rules without literal
text are not obeyed, and a database that is locked or damaged keeps the last rules in force.
(`POST /feedback`: tests/test_http_api.py; rule semantics: tests/lifecycle/test_feedback_rules.py.)"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alerts_support import FakeClock, anomaly, webhook, write_routes
from feedback_support import locked
from prometheus_client import REGISTRY

from logstream.alerts.config import load_config
from logstream.alerts.outbox import Outbox
from logstream.consumers.inputs import parse_lines
from logstream.detector import Detector, ScoredLine
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.lifecycle.feedback import Feedback, FeedbackError, FeedbackRules, FeedbackStore
from logstream.lifecycle.feedback_cli import give
from logstream.lifecycle.feedback_targets import AmbiguousTarget, Stamp, Target


def obey(detector: Detector, rules: FeedbackRules | None) -> None:
    """Give the detector the operators' rules (None: none)."""
    detector.rules = rules


def _score(detector: Detector, lines: list[str]) -> list[ScoredLine]:
    detector.reset()
    return detector.score(parse_lines(lines, STREAM_KEY))


@pytest.fixture(scope="module")
def incident_log() -> tuple[list[str], list[str | None]]:
    log = generate_lines(600, seed=7, incidents=("new_template", "unseen_value") * 3)
    return log.lines, log.kinds


@pytest.fixture(scope="module")
def detector(synthetic_model_dir: Path) -> Iterator[Detector]:
    """One loaded detector for the tests that score; each sets its own `feedback`."""
    loaded = Detector.load(synthetic_model_dir, device="cpu", false_alarm_rate=5e-3)
    yield loaded
    obey(loaded, None)


def _flagged(detector: Detector, incident_log: tuple[list[str], list[str | None]]) -> list[ScoredLine]:
    lines, kinds = incident_log
    obey(detector, None)
    scored = _score(detector, lines)
    flagged = [s for s, k in zip(scored, kinds, strict=True) if k == "new_template" and s.is_anomaly]
    assert flagged, "the model must flag the new-template incident for this test to mean anything"
    return flagged


def test_normal_verdict_suppresses_its_template_at_once_and_after_a_restart(
    synthetic_model_dir: Path,
    detector: Detector,
    incident_log: tuple[list[str], list[str | None]],
    tmp_path: Path,
) -> None:
    """A "normal" verdict on a flagged incident's template (as its alert shows it, widened by
    the incident's later lines) stops every line of it from alerting from the next refresh on
    (scores unchanged, marked suppressed), other incidents still alert, and a freshly loaded
    detector on the same database obeys it from its start."""
    lines, kinds = incident_log
    obey(detector, None)
    before = _score(detector, lines)
    assert _flagged(detector, incident_log)
    template = [s.template for s, k in zip(before, kinds, strict=True) if k == "new_template"][-1]
    db = tmp_path / "outbox.sqlite"
    clock = FakeClock()
    obey(detector, FeedbackRules(FeedbackStore(db), refresh_seconds=5, clock=clock))
    (made,) = give(
        "normal", db, Target(template=template), stamp=Stamp(created_by="alice", comment="known pool warning")
    )
    assert (made.verdict, made.created_by, made.comment) == ("normal", "alice", "known pool warning")
    assert made.created_at > 0 and made.target == f"template:{template}"

    def check(after: list[ScoredLine]) -> None:
        marked = [a for a, k in zip(after, kinds, strict=True) if k == "new_template"]
        assert not any(a.is_anomaly for a in marked)
        assert any(a.suppressed and a.score > a.threshold for a in marked)
        others = [a.is_anomaly for a, k in zip(after, kinds, strict=True) if k == "unseen_value"]
        was = [b.is_anomaly for b, k in zip(before, kinds, strict=True) if k == "unseen_value"]
        assert others == was

    clock.advance(5)  # the CLI wrote it; a running detector reads it at its next refresh
    check(_score(detector, lines))
    restarted = Detector.load(synthetic_model_dir, device="cpu", false_alarm_rate=5e-3)
    obey(restarted, FeedbackRules(FeedbackStore(db)))
    check(_score(restarted, lines))


def test_rules_without_literal_text_in_the_database_silence_nothing(
    detector: Detector, incident_log: tuple[list[str], list[str | None]], tmp_path: Path
) -> None:
    """39 "normal" rows `<TS> <*> ... <*>` (one per line length), written straight into the
    table as an older release accepted them, leave every flagged line flagged."""
    lines, _ = incident_log
    flagged = _flagged(detector, incident_log)
    db = tmp_path / "outbox.sqlite"
    FeedbackStore(db)
    raw = sqlite3.connect(db)
    raw.executemany(
        "INSERT INTO feedback (verdict, template, line, target, model, created_by, comment, created_at)"
        " VALUES ('normal', ?, '', '', '', 'mallory', '', 0)",
        [(" ".join(["<TS>", *["<*>"] * n]),) for n in range(1, 40)],
    )
    raw.commit()
    raw.close()
    obey(detector, FeedbackRules(FeedbackStore(db)))
    after = _score(detector, lines)
    assert {s.record.offset for s in flagged} <= {s.record.offset for s in after if s.is_anomaly}
    assert not any(s.suppressed for s in after)


def _refresh_errors(kind: str) -> float:
    return REGISTRY.get_sample_value("logstream_feedback_refresh_errors_total", {"kind": kind}) or 0.0


def _verdict_on_first_flagged(
    detector: Detector, incident_log: tuple[list[str], list[str | None]], db: Path, clock: FakeClock
) -> None:
    """A "normal" verdict on the first flagged line's template, in force in `detector`."""
    flagged = _flagged(detector, incident_log)
    give("normal", db, Target(line=flagged[0].record.line), normalizer=detector.normalizer)
    obey(detector, FeedbackRules(FeedbackStore(db), refresh_seconds=5, clock=clock))


def test_scoring_goes_on_while_the_feedback_database_is_locked(
    detector: Detector, incident_log: tuple[list[str], list[str | None]], tmp_path: Path
) -> None:
    """While another process holds the database exclusively, every line is still scored,
    the rules read before stay in force, the failed read is counted (kind busy); once the
    lock is gone a new verdict is read at the next refresh."""
    lines, kinds = incident_log
    db = tmp_path / "feedback.sqlite"
    clock = FakeClock()
    _verdict_on_first_flagged(detector, incident_log, db, clock)
    busy = _refresh_errors("busy")
    with locked(db):
        with pytest.raises(FeedbackError, match="locked"):
            FeedbackStore(db, timeout=0.1).add(Feedback("anomaly", "ERROR disk <*> failed"))
        clock.advance(5)
        during = _score(detector, lines)
    assert len(during) == len(lines) and _refresh_errors("busy") == busy + 1
    assert any(s.suppressed for s, k in zip(during, kinds, strict=True) if k == "new_template")
    (marked,) = FeedbackStore(db).listed()
    FeedbackStore(db).add(Feedback("anomaly", marked.template))
    clock.advance(5)
    after = _score(detector, lines)
    assert not any(s.suppressed for s in after)


def test_the_store_opens_while_the_database_is_locked(tmp_path: Path) -> None:
    """Serve opens its feedback store at start: while another process holds the database (a
    backup), opening it and its rules succeeds (no crash loop; no verdicts read yet), and
    once the lock is gone the first verdict is written and read."""
    db = tmp_path / "feedback.sqlite"
    FeedbackStore(db)  # the table exists, as after an earlier run
    with locked(db):
        store = FeedbackStore(db, timeout=0.1)
        rules = FeedbackRules(store, refresh_seconds=0.0)
        assert rules.verdict("ERROR disk <*> failed on sda", "default") is None
    store.add(Feedback("anomaly", "ERROR disk <*> failed on sda", created_by="ops"))
    rules.refresh()
    assert rules.verdict("ERROR disk <*> failed on sda", "default") == "anomaly"


def test_scoring_goes_on_when_the_feedback_database_is_damaged(
    detector: Detector, incident_log: tuple[list[str], list[str | None]], tmp_path: Path
) -> None:
    """Another process adds a verdict (checkpointed into the file), then the file is
    overwritten with garbage (a broken restore): scoring goes on with the rules read before, the failed read is counted (kind
    notadb), and it is tried again at each refresh."""
    lines, kinds = incident_log
    db = tmp_path / "feedback.sqlite"
    clock = FakeClock()
    _verdict_on_first_flagged(detector, incident_log, db, clock)
    added = subprocess.run(
        [sys.executable, "-c", "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]);"
         " db.execute(\"INSERT INTO feedback (verdict, template, line, target, model, created_by, comment,"
         " created_at) VALUES ('normal', 'INFO a b c', '', '', '', '', '', 0)\"); db.commit();"
         " db.execute('PRAGMA wal_checkpoint(TRUNCATE)')", str(db)],
        timeout=60, check=False,
    )  # fmt: skip
    assert added.returncode == 0
    with db.open("r+b") as f:
        f.write(b"\x00not a database" * (os.path.getsize(db) // 15))
    notadb = _refresh_errors("notadb")
    for _ in range(2):
        clock.advance(5)
        scored = _score(detector, lines)
        assert len(scored) == len(lines)
        assert any(s.suppressed for s, k in zip(scored, kinds, strict=True) if k == "new_template")
    assert _refresh_errors("notadb") == notadb + 2


def test_latest_verdict_wins_and_replicas_see_it_at_their_refresh(tmp_path: Path) -> None:
    """Two processes' rules on one database: a verdict written through one is in effect in the
    other at its next refresh (not before), and "anomaly" after "normal" undoes it."""
    db = tmp_path / "shared.sqlite"
    clock = FakeClock()
    writer, reader = FeedbackStore(db), FeedbackStore(db)
    rules = FeedbackRules(reader, refresh_seconds=5, clock=clock)
    template = "INFO job <NUM>: step <*> rows=<NUM>"
    writer.add(Feedback("normal", template, created_by="bob"))
    rules.refresh()
    assert rules.verdict(template, "default") != "normal"  # read at start; the next read is due in 5 s
    clock.advance(5)
    rules.refresh()
    assert rules.verdict(template, "default") == "normal"
    assert (
        rules.verdict("INFO job <NUM>: step fetch rows=<NUM>", "default") == "normal"
    )  # Drain's narrower form
    assert rules.verdict("INFO job <NUM>: step fetch", "default") != "normal"  # another shape
    writer.add(Feedback("anomaly", template, created_by="carol"))
    clock.advance(5)
    rules.refresh()
    assert rules.verdict(template, "default") != "normal"
    assert [f.verdict for f in reader.listed()] == ["normal", "anomaly"]


def test_feedback_refuses_unknown_verdicts_and_unresolvable_targets(tmp_path: Path) -> None:
    """An unknown verdict, no target at all, or a raw line without the model is a one-line error."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    with pytest.raises(FeedbackError, match="verdict"):
        store.add(Feedback("fine", "GET <*>"))
    with pytest.raises(FeedbackError, match="exactly one"):
        give("normal", tmp_path / "f.sqlite", Target())
    with pytest.raises(FeedbackError, match="needs the model"):
        give("normal", tmp_path / "f.sqlite", Target(line="GET /x 200"))


def _outbox_with_one_group(tmp_path: Path, templates: list[int]) -> tuple[Path, str]:
    """An outbox (grouped by stream, the default) whose one group holds one alert per test
    template id given; (its file, the group's fingerprint)."""
    routes = write_routes(tmp_path, [webhook("hook", "http://127.0.0.1:9")], route={"group_by": ["stream"]})
    config = load_config(routes, secrets=False)
    outbox = Outbox(config.delivery.outbox, config, clock=FakeClock())
    outbox.put([anomaly(template_id=t, line=LINES[t]) for t in templates])
    alert = outbox.flush(FakeClock().now + 1)[0]
    outbox.close()
    return Path(config.delivery.outbox), alert.dedup_key


LINES = {
    3: "Nov 9 12:01:01 db-1 kernel: Out of memory: Killed process 4121 (postgres)",
    4: "Nov 9 12:01:02 db-1 sshd[812]: Failed password for root from 10.0.0.7 port 52211 ssh2",
    5: "Nov 9 12:01:03 db-1 kernel: EXT4-fs error (device sda1): no space left on device",
}


def test_fingerprint_of_a_one_template_group_resolves_through_the_outbox(tmp_path: Path) -> None:
    """An alert's fingerprint (its dedup_key) names the template, first line and model of its
    group in the outbox that raised it; the verdict lands in that same database."""
    db, fingerprint = _outbox_with_one_group(tmp_path, [3])
    (made,) = give("normal", db, Target(fingerprint=fingerprint))
    assert made.template == "ERROR disk <PATH> failed with <*> (case 3)" and made.line == LINES[3]
    assert made.model == "tiny-test-model"
    with pytest.raises(FeedbackError, match="no such alert"):
        give("normal", db, Target(fingerprint="logstream-nope"))


def test_fingerprint_of_a_group_with_several_templates_asks_which(tmp_path: Path) -> None:
    """A group holding three templates is not resolved to its first: without a choice the
    verdict is refused with the templates listed; `pick` 2 marks the second only, `every`
    marks all three."""
    db, fingerprint = _outbox_with_one_group(tmp_path, [3, 4, 5])
    store = FeedbackStore(db)
    with pytest.raises(AmbiguousTarget) as refused:
        give("normal", db, Target(fingerprint=fingerprint))
    assert len(refused.value.templates) == 3 and "Failed password" in refused.value.templates[1]
    assert store.listed() == []
    (second,) = give("normal", db, Target(fingerprint=fingerprint, pick=2))
    assert second.template == refused.value.templates[1] and second.line == LINES[4]
    every = give("anomaly", db, Target(fingerprint=fingerprint, every=True))
    assert [f.template for f in every] == refused.value.templates


def test_cli_lists_a_groups_templates_and_takes_a_number(tmp_path: Path) -> None:
    """`feedback normal --fingerprint` on a group of several templates prints them, numbered,
    and exits 2 storing nothing; `--template 3` stores the third, as by the OS user."""
    db, fingerprint = _outbox_with_one_group(tmp_path, [3, 4, 5])
    base = [
        sys.executable,
        "-m",
        "logstream.cli",
        "feedback",
        "normal",
        "--db",
        db,
        "--fingerprint",
        fingerprint,
    ]
    asked = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
    assert asked.returncode == 2 and "--template N or --all" in asked.stderr
    assert "  3  " in asked.stderr and "no space left on device" in asked.stderr
    assert FeedbackStore(db).listed() == []
    done = subprocess.run(
        [*base, "--template", "3"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    (stored,) = FeedbackStore(db).listed()
    assert "no space left on device" in stored.template and stored.remote.startswith("local:")
    assert stored.created_by


def test_cli_marks_a_file_line_normal(synthetic_model_dir: Path, tmp_path: Path) -> None:
    """`logstream feedback normal --at path:line --model DIR --stream GLOB --for 2h` masks that
    line with the model's rules and stores it scoped and expiring; `feedback list` shows it
    in force; a bad target is one line, exit 2."""
    log = tmp_path / "app.log"
    log.write_text("first line\nERROR db: connection pool exhausted after 5000ms\n")
    db = tmp_path / "fb.sqlite"
    base = [sys.executable, "-m", "logstream.cli", "feedback"]
    done = subprocess.run(
        [*base, "normal", "--db", db, "--model", synthetic_model_dir, "--at", f"{log}:2", "-c", "why",
         "--stream", "db-*", "--for", "2h"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "normal: ERROR db: connection pool exhausted after" in done.stdout and "(streams db-*)" in done.stdout
    )
    listed = subprocess.run([*base, "list", "--db", db], capture_output=True, text=True, timeout=120)
    assert '"comment": "why"' in listed.stdout and f'"target": "at:{log}:2"' in listed.stdout
    assert '"stream": "db-*"' in listed.stdout and '"state": "in force"' in listed.stdout
    bad = subprocess.run(
        [*base, "normal", "--db", db, "--model", synthetic_model_dir, "--at", f"{log}:9"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip() == f"error: {log} has fewer than 9 lines"
