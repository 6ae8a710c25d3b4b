"""What a feedback rule may say and how rules combine (logstream.lifecycle.feedback), on real SQLite
files: literal text required, stream scopes, expiry, the most specific rule winning with
"anomaly" on ties, the rules in force listed, and retention."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from logstream.lifecycle.feedback import Feedback, FeedbackError, FeedbackRules, FeedbackStore
from logstream.text.normalize import DEFAULT_RULES
from logstream.text.patterns import PatternMiner

NOW = 1_800_000_000.0
OOM = "<TS> <HOST> kernel: Out of memory: Killed process <NUM> (<*>)"


def _rules(db: Path, *verdicts: Feedback) -> FeedbackRules:
    store = FeedbackStore(db)
    for feedback in verdicts:
        store.add(feedback, now=NOW)
    store.close()
    return FeedbackRules(FeedbackStore(db), refresh_seconds=3600)


def test_rules_of_masks_and_wildcards_are_refused(tmp_path: Path) -> None:
    """`<TS> <*> ... <*>`, one per line length (the rules that silenced every line), and any
    template with less than half literal text, are refused with one line naming the reason."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    for length in range(1, 40):
        with pytest.raises(FeedbackError, match="literal text"):
            store.add(Feedback("normal", " ".join(["<TS>", *["<*>"] * length])))
    with pytest.raises(FeedbackError, match="1 of its 4 tokens"):
        store.add(Feedback("normal", "<TS> <HOST> kernel: <*> <*>"))
    assert store.listed() == []


@pytest.mark.parametrize("mask", sorted({rule.replacement for rule in DEFAULT_RULES}))
def test_every_mask_the_normalizer_writes_is_not_literal_text(tmp_path: Path, mask: str) -> None:
    """Each placeholder a default mask rule writes (`<IP>`, `<PATH>`, ...) counts as no text,
    alone or inside a token (`/<IP>`, `[<NUM>]`)."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    with pytest.raises(FeedbackError, match="0 of its"):
        store.add(Feedback("normal", f"{mask} [{mask}] /{mask}: <*>"))


def test_a_rule_with_half_its_tokens_literal_is_stored(tmp_path: Path) -> None:
    """A mined template's usual shape passes: the masked header counts as one token."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    assert store.add(Feedback("normal", OOM)).id == 1
    assert store.add(Feedback("normal", "<TS> <HOST> sshd[<NUM>]: Accepted <*> for <*>")).id == 2


def test_a_scoped_rule_applies_to_its_streams_only(tmp_path: Path) -> None:
    """A "normal" scoped to `db-*` covers the template on db-1, not on web-1."""
    rules = _rules(tmp_path / "f.sqlite", Feedback("normal", OOM, stream="db-*"))
    assert rules.verdict(OOM, "db-1", NOW) == "normal"
    assert rules.verdict(OOM, "web-1", NOW) is None


def test_an_expiring_rule_stops_and_the_verdict_before_it_returns(tmp_path: Path) -> None:
    """A temporary "normal" over a lasting "anomaly" on the same template and scope holds
    until its expiry; then the anomaly verdict is in force again."""
    rules = _rules(
        tmp_path / "f.sqlite",
        Feedback("anomaly", OOM),
        Feedback("normal", OOM, expires_at=NOW + 3600),
    )
    assert rules.verdict(OOM, "db-1", NOW + 10) == "normal"
    assert rules.verdict(OOM, "db-1", NOW + 3600) == "anomaly"


def test_an_anomaly_overrides_a_broader_normal_rule(tmp_path: Path) -> None:
    """A confirmed anomaly wins over a "normal" whose template covers more lines; lines the
    anomaly rule does not cover stay normal."""
    broad = "<TS> <HOST> kernel: Out of <*> Killed process <NUM> (<*>)"
    rules = _rules(tmp_path / "f.sqlite", Feedback("normal", broad), Feedback("anomaly", OOM))
    assert rules.verdict(OOM, "db-1", NOW) == "anomaly"
    assert rules.verdict(OOM.replace("memory:", "swap:"), "db-1", NOW) == "normal"


def test_a_rule_is_as_specific_as_the_template_it_covers_lets_it_be(tmp_path: Path) -> None:
    """A "normal" on one line's narrow form and an "anomaly" on the widened template Drain
    mines for it say as much about that template's lines: a tie, so "anomaly"."""
    mined = "<TS> <HOST> kernel: Out of memory: Killed process <NUM> <*>"
    narrow = "<TS> <HOST> kernel: Out of memory: Killed process <NUM> (postgres)"
    rules = _rules(tmp_path / "f.sqlite", Feedback("anomaly", mined), Feedback("normal", narrow))
    assert rules.verdict(mined, "db-1", NOW) == "anomaly"


def test_a_detailed_rule_does_not_cover_a_template_widened_past_half(tmp_path: Path) -> None:
    """A rule from one access-log line does not cover the template Drain widened to mostly
    `<*>` (it would silence every status); it still covers the narrow form itself."""
    line_rule = "<TS> web-0 INFO http: POST <PATH> status=503 bytes=4000 ms=12"
    rules = _rules(tmp_path / "f.sqlite", Feedback("normal", line_rule))
    assert rules.verdict("<TS> <*> INFO http: <*> <PATH> <*> <*> <*>", "web-0", NOW) is None
    assert rules.verdict(line_rule, "web-0", NOW) == "normal"


def test_a_rule_covers_pipe_separated_lines_as_the_miner_splits_them(tmp_path: Path) -> None:
    """Fields separated by `|` (HealthApp's layout) are tokens to the miner, so the template it
    mines for a line has spaces there: a rule on that template covers the line it came from
    and the line's siblings, not only text split at whitespace."""
    masked = "<TS>|indexer.Main|<NUM>|Shutdown hook invoked, exit code 143"
    mined = PatternMiner().add(masked).template
    assert mined == "<TS> indexer.Main <NUM> Shutdown hook invoked, exit code 143"
    rules = _rules(tmp_path / "f.sqlite", Feedback("anomaly", mined.replace("143", "<*>")))
    assert rules.verdict(masked, "app", NOW) == "anomaly"
    assert rules.verdict(masked.replace("143", "1"), "app", NOW) == "anomaly"
    assert rules.verdict(masked.replace("Shutdown", "Startup"), "app", NOW) is None


def test_anomaly_wins_a_tie_whatever_the_order(tmp_path: Path) -> None:
    """Two rules as specific as each other (same template, scopes of one literal character
    each) disagree: "anomaly", whichever came last."""
    rules = _rules(
        tmp_path / "f.sqlite", Feedback("anomaly", OOM, stream="d*"), Feedback("normal", OOM, stream="*1")
    )
    assert rules.verdict(OOM, "d1", NOW) == "anomaly"


def test_a_narrower_scope_beats_a_wider_one(tmp_path: Path) -> None:
    """Same template: the rule for `db-1` wins over the one for every stream on db-1 only."""
    rules = _rules(tmp_path / "f.sqlite", Feedback("anomaly", OOM), Feedback("normal", OOM, stream="db-1"))
    assert rules.verdict(OOM, "db-1", NOW) == "normal"
    assert rules.verdict(OOM, "db-2", NOW) == "anomaly"


def test_effective_lists_the_rules_in_force(tmp_path: Path) -> None:
    """`effective` gives one rule per template and scope, the newest not expired, with its
    verdict, template and scope; an expired or replaced verdict is not listed."""
    rules = _rules(
        tmp_path / "f.sqlite",
        Feedback("normal", OOM),
        Feedback("anomaly", OOM),
        Feedback("normal", "ERROR disk <*> failed", stream="db-*"),
        Feedback("normal", "WARN cache evicted <NUM> keys", expires_at=NOW + 60),
    )
    listed = [(f.verdict, f.template, f.stream) for f in rules.effective(NOW + 120)]
    assert listed == [("anomaly", OOM, "*"), ("normal", "ERROR disk <*> failed", "db-*")]


def test_prune_drops_what_expired_or_was_replaced_past_the_retention(tmp_path: Path) -> None:
    """Past the retention: an expired verdict and one a lasting newer verdict replaced are
    deleted; the verdict in force and a replaced one that may come back (its replacement
    expires first) stay."""
    store = FeedbackStore(tmp_path / "f.sqlite")
    day = 86400.0
    store.add(Feedback("normal", OOM), now=NOW)  # replaced for good by the anomaly below
    store.add(Feedback("anomaly", OOM), now=NOW + day)
    store.add(Feedback("normal", "WARN cache evicted <NUM> keys", expires_at=NOW + 2 * day), now=NOW)
    lasting = store.add(Feedback("normal", "ERROR disk <*> failed"), now=NOW)
    store.add(Feedback("anomaly", "ERROR disk <*> failed", expires_at=NOW + 3 * day), now=NOW + day)
    assert store.prune(retention_days=30, now=NOW + 10 * day) == 0
    assert store.prune(retention_days=30, now=NOW + 40 * day) == 3
    assert [f.id for f in store.listed()] == [2, lasting.id]


def test_rules_written_before_the_literal_rule_are_ignored(tmp_path: Path) -> None:
    """A row that fails the check (written straight into the table, as an older release
    stored them) is never in force; the valid rules beside it are."""
    db = tmp_path / "f.sqlite"
    store = FeedbackStore(db)
    store.add(Feedback("normal", OOM))
    raw = sqlite3.connect(db)
    raw.execute(
        "INSERT INTO feedback (verdict, template, line, target, model, created_by, comment, created_at)"
        " VALUES ('normal', '<TS> <*> <*> <*>', '', '', '', '', '', 0)"
    )
    raw.commit()
    raw.close()
    rules = FeedbackRules(store)
    assert rules.verdict("<TS> <*> <*> <*>", "db-1") is None
    assert [f.template for f in rules.effective()] == [OOM]


def test_cli_refuses_a_rule_without_literal_text(tmp_path: Path) -> None:
    """`logstream feedback normal --template '<TS> <*> <*>'` is one line on stderr, exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "feedback", "normal", "--db", tmp_path / "f.sqlite",
         "--template", "<TS> <*> <*>"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "literal text" in done.stderr
