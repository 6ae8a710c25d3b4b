"""Masking (logstream/text/normalize.py): no variable value survives it on any loghub sample, the
values that carry meaning stay; the masking rules; level fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from loghub_support import SAMPLES, needs_loghub, read

from logstream.text.normalize import DEFAULT_RULES, Normalizer, parse_level

# Values that must never survive masking, whatever the system.
LEAKS = {
    "ipv4": re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b"),
    "uuid": re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
    "block_id": re.compile(r"blk_-?\d+"),
    "long_number": re.compile(r"(?<![\w.])\d{4,}(?![\w.])"),
    "hh:mm:ss": re.compile(r"\b\d{2}:\d{2}:\d{2}\b"),
}


@needs_loghub
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name.split("_")[0])
def test_masking_leaves_no_variable_values(sample: Path) -> None:
    """No IP, UUID, block id, long number or clock time survives masking in any loghub system."""
    normalizer = Normalizer()
    for line in read(sample):
        masked = normalizer.mask(line)
        for name, leak in LEAKS.items():
            assert not leak.search(masked), f"{name} leaked in {masked!r} (from {line!r})"


def test_masking_keeps_short_parameter_values() -> None:
    """Status codes and small counts stay visible: `status=503` must differ from `status=200`."""
    normalizer = Normalizer()
    assert normalizer.mask("GET /x status=503 ms=12") != normalizer.mask("GET /x status=200 ms=12")
    assert "<NUM>" in normalizer.mask("took 12345 bytes")


@pytest.mark.parametrize(
    ("short", "long"),
    [
        ("Got assigned task 479", "Got assigned task 1479"),
        ("Running task 4.0 in stage 11.0 (TID 479)", "Running task 4.0 in stage 11.0 (TID 1479)"),
        ("child exited, pid=812", "child exited, pid=24812"),
        ("send_datagram_available_ping: pid 445 failed", "send_datagram_available_ping: pid 4450 failed"),
    ],
)
def test_masking_treats_a_named_id_alike_at_any_length(short: str, long: str) -> None:
    """An integer the text names a process, thread or task id masks the same below and above
    1,000: Spark's task ids cross 999 within a job, and a baseline of 4-digit ids must not
    make every 3-digit one new (docs/quality.md, Spark_2k)."""
    normalizer = Normalizer()
    assert normalizer.mask(short) == normalizer.mask(long)
    assert "<NUM>" in normalizer.mask(short)


def test_masking_keeps_an_integer_that_is_not_named_an_id() -> None:
    """The id rule needs its name: a short value after any other word stays visible."""
    normalizer = Normalizer()
    assert normalizer.mask("exit code 1 after 3 retries") == "exit code 1 after 3 retries"
    assert normalizer.mask("sshd[812]: 5 tasks, task 4.0 done") == "sshd[812]: 5 tasks, task <NUM> done"


def test_masking_a_bluegene_line_leaves_only_its_message() -> None:
    """BlueGene/L's RAS log (loghub's BGL, no sample here): the IBM timestamp with its
    microseconds, the node's location code and a core file's number are masked, so the same
    message from another node at another time masks to the same text; a short number stays."""
    normalizer = Normalizer()
    message = "<NUM> <DATE> <HOST> <TS> <HOST> RAS KERNEL INFO generating core.<NUM>"
    for line in (
        "1117955341 2005.06.05 R33-M1-NF-C:J02-U01 2005-06-05-00.09.01.903951 R33-M1-NF-C:J02-U01 "
        "RAS KERNEL INFO generating core.2275",
        "1118769125 2005.06.14 R27-M1-L3-U18-C 2005-06-14-10.12.05.437461 R27-M1-L3-U18-C "
        "RAS KERNEL INFO generating core.40213",
    ):
        assert normalizer.mask(line) == message
    assert normalizer.mask("RAS KERNEL INFO generating core.13 on R27-M1-L3-U18-C") == (
        "RAS KERNEL INFO generating core.13 on <HOST>"
    )


@pytest.mark.parametrize(
    "text", ["UTF-8", "X11-Forwarding", "SHA256-RSA", "libc-2.3.4", "kernel 2.6.5", "10.0.0.1"]
)
def test_masking_keeps_words_that_look_like_a_location_or_a_dotted_number(text: str) -> None:
    """The location rule needs a letter and digits, then upper-case segments; the number
    after a dot needs a name before the dot."""
    masked = Normalizer().mask(f"using {text} now")
    assert "<HOST>" not in masked and "<NUM>" not in masked, masked


def test_masking_rules_round_trip_through_json() -> None:
    """Rules saved in logstream.json load back into an identical normalizer."""
    normalizer = Normalizer()
    line = "2026-11-02T08:00:00.316Z 10.0.0.1 blk_-42 req-1234abcd-ffff"
    assert Normalizer.from_json(normalizer.to_json()).mask(line) == normalizer.mask(line)


@needs_loghub
def test_skipping_a_rule_on_a_line_without_its_literals_masks_the_same() -> None:
    """`mask` skips a rule on a line lacking every literal the rule needs; on every loghub line
    (and lines built to hold each kind of value) that gives what running every rule gives."""
    values = ["2015-10-18 18:01:47,978", "Jun 14 15:16:01", "00:1a:2b:3c:4d:5e", "2005.06.03",
              "req-0a1b2c3d-4e5f", "blk_-12345", "pid=9", "(TID 479)", "task 12", "10.0.0.1:8080",
              "/var/log/x.log", "-3.14", "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
              "2005-06-03-15.42.50.675872", "R02-M1-N0-C:J12-U11", "R27-M1-L3-U18-C", "core.2275"]  # fmt: skip
    lines = [line for sample in SAMPLES for line in read(sample)]
    lines += [f"{a} {b}" for a in values for b in values]
    compiled = [(re.compile(rule.pattern), rule.replacement) for rule in DEFAULT_RULES]
    normalizer = Normalizer()
    for line in lines:
        every_rule = line
        for regex, replacement in compiled:
            every_rule = regex.sub(replacement, every_rule)
        assert normalizer.mask(line) == every_rule, line


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("2015-10-18 18:01:47,978 INFO [main] started", "info"),
        ("[Sun Dec 04 04:47:44 2005] [error] mod_jk child in error state 6", "error"),
        ("081109 203615 148 WARN dfs.DataNode: slow", "warning"),
        ("FATAL kernel panic", "critical"),
        ("user logged in", None),
    ],
)
def test_parse_level(line: str, level: str | None) -> None:
    """Levels are read from common formats and mapped to one vocabulary."""
    assert parse_level(line) == level
