"""Grouping a replay by template (the anomaly table, the pattern view) and what it may claim."""

from __future__ import annotations

from alerts_support import anomaly

from logstream.records import LogRecord
from logstream.replay import Unit
from logstream.report.groups import anomaly_groups, group_by_template, mark_new_words
from logstream.scoring.scorer import ScoredLine
from logstream.text.explain import Explanation, Word


def _unit(line: int, text: str, template: str, score: float, stream: str = "web-1", word: str = "") -> Unit:
    explanation = None
    if word:
        start = text.index(word)
        explanation = Explanation(text, (Word(word, start, start + len(word), 9.0),), ((text, False),))
    flagged = anomaly(stream=stream, line=text, score=score) if score > 3.0 else None  # over the threshold
    scored = ScoredLine(
        LogRecord(line=text, stream=stream), score, threshold=3.0, surprisal=0.0, template=template,
        explanation=explanation,
    )  # fmt: skip
    return Unit(scored, score, label=None, line=line, anomaly=flagged)


def test_a_template_that_generalizes_is_one_group() -> None:
    """Drain's first line of a kind keeps its exact text, the next generalizes it: one group,
    with count, first and last line, and the worst score."""
    units = [
        _unit(3, "ntpd synchronized to 10.0.0.1", "ntpd synchronized to <IP> stratum 2", 5.0),
        _unit(9, "ntpd synchronized to 10.0.0.2", "ntpd synchronized to <IP> stratum <*>", 7.5),
        _unit(12, "ntpd synchronized to 10.0.0.3", "ntpd synchronized to <IP> stratum <*>", 4.0),
        _unit(20, "disk sda1 full", "disk <*> full", 1.0),
    ]
    groups = anomaly_groups(group_by_template(units))
    assert len(groups) == 1
    (group,) = groups
    assert (group.count, group.first, group.last, group.worst.line) == (3, 3, 12, 9)
    assert group.template == "ntpd synchronized to <IP> stratum <*>"


def test_patterns_count_every_line_and_anomalies_are_the_flagged_ones() -> None:
    """The pattern view counts all lines of a template; its anomaly group only the flagged ones."""
    units = [_unit(i, f"job {i} started", "job <*> started", 1.0) for i in range(1, 6)]
    units.append(_unit(6, "job 6 started", "job <*> started", 8.0))
    patterns = group_by_template(units)
    assert [(p.template, p.count, p.first) for p in patterns] == [("job <*> started", 6, 1)]
    assert [(g.count, g.first) for g in anomaly_groups(patterns)] == [(1, 6)]


def test_new_words_are_claimed_only_against_the_same_streams_earlier_lines() -> None:
    """`503` is new to web-1 if no earlier web-1 line has it, even when another stream had it;
    a word the stream showed before is not claimed."""
    units = [
        _unit(1, "web-2 status=503", "<HOST> status=<*>", 1.0, stream="web-2"),
        _unit(2, "web-1 status=200", "<HOST> status=<*>", 1.0),
        _unit(3, "web-1 status=503", "<HOST> status=<*>", 8.0, word="503"),
        _unit(4, "web-1 status=200", "<HOST> status=<*>", 8.0, word="200"),
    ]
    mark_new_words(units, [(u.line, u.stream, u.text) for u in units])
    assert [u.new_words for u in units] == [(), (), ("503",), ()]
