"""logstream.evaluation.synth.with_sessions: stream-specific context for the rebalance benchmark."""

from __future__ import annotations

import re

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines, with_sessions
from logstream.text.normalize import Normalizer

OPENED = re.compile(r"INFO session: opened session=([a-z]{6})$")


def test_original_lines_labels_and_kinds_are_kept_in_order() -> None:
    """Every original line comes out once, in order, with ` session=<id>` appended and its
    label and kind; the added lines are `opened` lines, normal (label 0, no kind)."""
    log = generate_lines(400, seed=3, incidents=INCIDENT_KINDS)
    out = with_sessions(log, seed=3)
    kept = [(line, label, kind) for line, label, kind in zip(out.lines, out.labels, out.kinds, strict=True)
            if not OPENED.search(line)]  # fmt: skip
    assert [(re.sub(r" session=[a-z]{6}$", "", line), label, kind) for line, label, kind in kept] == list(
        zip(log.lines, log.labels, log.kinds, strict=True)
    )
    added = [(label, kind) for line, label, kind in zip(out.lines, out.labels, out.kinds, strict=True)
             if OPENED.search(line)]  # fmt: skip
    assert added and set(added) == {(0, None)}


def test_each_stream_carries_the_id_its_last_opened_line_announced() -> None:
    """A stream's lines end in the id of its latest `opened` line, a session lasts within the
    given bounds (its last one may be cut short), and streams draw different ids."""
    out = with_sessions(generate_lines(2000, seed=4), seed=4, lines=(5, 9))
    current: dict[str, str] = {}
    length: dict[str, list[int]] = {}
    for line in out.lines:
        stream = re.search(STREAM_KEY, line).group(1)
        opened = OPENED.search(line)
        if opened:
            assert stream not in current or length[stream][-1] >= 5
            current[stream] = opened.group(1)
            length.setdefault(stream, []).append(0)
        else:
            assert line.endswith(f" session={current[stream]}")
            length[stream][-1] += 1
    assert all(5 <= n <= 9 for lengths in length.values() for n in lengths[:-1])
    assert len(set(current.values())) == len(current) > 1


def test_masking_keeps_the_session_id() -> None:
    """The id is context only if the model sees it: no masking rule replaces it."""
    out = with_sessions(generate_lines(50, seed=5), seed=5)
    normalizer = Normalizer()
    for line in out.lines:
        sid = line.rsplit("session=", 1)[1]
        assert normalizer.mask(line).endswith(f"session={sid}")
