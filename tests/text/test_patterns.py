"""Template mining (logstream/text/patterns.py): few templates per system on every loghub sample,
stable ids, a bounded miner that gives what Drain gives, novelty against the training
templates, templates from the message rather than the header."""

from __future__ import annotations

from pathlib import Path

import pytest
from loghub_support import SAMPLES, needs_loghub, read

from logstream.text.normalize import Normalizer
from logstream.text.patterns import mine, pattern_prompt


@needs_loghub
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name.split("_")[0])
def test_mining_compresses_each_system_to_few_templates(sample: Path) -> None:
    """2,000 masked lines of one system mine to far fewer templates than distinct lines, each
    with a positive count."""
    normalizer = Normalizer()
    raw = read(sample)
    lines = [normalizer.mask(line) for line in raw]
    templates = mine(lines).templates()
    assert 1 <= len(templates) < len(set(raw)) / 2 or len(set(raw)) < 10
    assert sum(t.count for t in templates) == len(lines)
    assert [t.count for t in templates] == sorted((t.count for t in templates), reverse=True)
    prompt = pattern_prompt(templates, max_templates=5)
    assert prompt == [t.text for t in templates[:5]]


def test_template_ids_are_stable_across_processes() -> None:
    """A template's id is a hash of its text: another process (another hash seed) gives the same id,
    so alert groups survive restarts."""
    import subprocess
    import sys

    from logstream.text.patterns import PatternMiner

    here = PatternMiner().add("ERROR db: connection pool exhausted").template_id
    code = "from logstream.text.patterns import PatternMiner; print(PatternMiner().add('ERROR db: connection pool exhausted').template_id)"
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"},
    ).stdout.strip()  # fmt: skip
    assert str(here) == there


def test_miner_keeps_at_most_its_cap_of_templates() -> None:
    """Unbounded distinct templates (hostile input) cannot grow the miner past its LRU cap."""
    from logstream.text.patterns import PatternMiner

    miner = PatternMiner(max_templates=5)
    for i in range(50):
        miner.add(f"{'abcdefghij'[i % 10]}{i} x{i} y{i}")
    assert miner.size <= 5


@pytest.mark.parametrize("max_templates", [10_000, 60])
def test_a_line_met_before_gets_what_drain_itself_gives(
    max_templates: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The miner skips Drain's search for a line that matched without changing anything, until
    the next new cluster or changed template. Over random lines of a few words (60 usual ones,
    and one in ten fresh: clusters created, templates widened, and with a cap of 60 of the 165
    templates the least recent forgotten), each line's template, id, cluster and novelty, and
    every cluster's count at the end, are those of drain3's own Drain fed the same lines. The
    cache is used: Drain searches fewer lines than it was given."""
    import random

    from logstream.text import patterns
    from logstream.text.patterns import Mined, PatternMiner, template_id

    monkeypatch.setattr(patterns, "CACHED_LINES", 40)  # emptied when full, too
    rng = random.Random(7)
    words = ["disk", "sda", "<NUM>", "<IP>", "error", "read", "failed", "ok", "retry"]

    def line() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 5)))

    usual = [line() for _ in range(60)]  # a log repeats its lines; one in ten is fresh
    lines = [line() if rng.random() < 0.1 else rng.choice(usual) for _ in range(3000)]
    miner, reference = PatternMiner(max_templates=max_templates), PatternMiner(max_templates=max_templates)
    drain = reference._miner.drain  # the uncached search: drain3's own
    searched = []
    search = miner._miner.drain.add_log_message
    monkeypatch.setattr(
        miner._miner.drain, "add_log_message", lambda line: searched.append(line) or search(line)
    )
    for line in lines:
        cluster, change = drain.add_log_message(line)
        text = cluster.get_template()
        assert miner.add(line) == Mined(
            template_id(text), text, change == "cluster_created", cluster.cluster_id
        )
    assert miner.templates() == reference.templates()
    assert len(searched) < len(lines) * 0.9


def test_novelty_is_relative_to_the_training_templates() -> None:
    """A miner seeded with the model's templates calls a training template known and a new one new."""
    from logstream.text.patterns import seeded_miner

    miner, _ = seeded_miner(["worker job <NUM> finished", "web GET /api status 200"])
    assert not miner.add("worker job <NUM> finished").new
    assert miner.add("kernel: Out of memory: Kill process <NUM>").new


def test_templates_come_from_the_message_not_the_masked_header() -> None:
    """BlueGene/L lines open with five masked fields every line shares: two different
    messages of one length are two templates (Drain over the whole line would merge them: 7 of
    13 tokens are equal), and one message from many nodes and times stays one template. Shared fields
    inside the message still count (`from <IP> port <NUM>`)."""
    from logstream.text.patterns import PatternMiner

    normalizer = Normalizer()
    header = "1117955341 2005.06.05 R33-M1-NF-C:J02-U01 2005-06-05-00.09.01.903951 R33-M1-NF-C:J02-U01 "
    other = "1118769125 2005.06.14 R27-M1-L3-U18-C 2005-06-14-10.12.05.437461 R27-M1-L3-U18-C "
    miner = PatternMiner()
    parity, panic, parity_again = (
        miner.add(normalizer.mask(line))
        for line in (
            header + "RAS KERNEL INFO instruction cache parity error corrected",
            header + "RAS KERNEL FATAL rts panic! - stopping execution",
            other + "RAS KERNEL INFO instruction cache parity error corrected",
        )
    )
    assert parity.template_id != panic.template_id and panic.new
    assert parity_again.template_id == parity.template_id and not parity_again.new
    sshd = PatternMiner()
    root, alice = (
        sshd.add(f"<TS> <HOST> sshd: Accepted password for {user} from <IP> port <NUM> ssh2")
        for user in ("root", "alice")
    )
    assert alice.cluster == root.cluster
