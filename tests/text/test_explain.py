"""Explanations in words: BPE surprisal mapped back to the words and values of the original line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from logstream.consumers.inputs import parse_lines
from logstream.detector import Detector
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.text.explain import Explanation, explain_line, line_token_offsets, mask_with_map
from logstream.text.normalize import DEFAULT_RULES, Normalizer

NORMALIZER = Normalizer()
LOGHUB_LIKE = [
    "Nov  9 12:01:01 dn228/dn228 crond[2916]: (root) CMD (run-parts /etc/cron.hourly)",
    "081109 203615 148 INFO dfs.DataNode$PacketResponder: Received block blk_-1608999687919862906 of size 91178",
    "Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure; rhost=218.188.2.4 user=root",
    "2017-07-01 12:00:00,123 ERROR conn to 10.0.0.5:8080 failed mac=00:1b:44:11:3a:b7 id=jA9J1Wd7019391",
    "req-0f8fad5b-d9cb-469f-a165-70867728950e GET /v2/servers/detail status: 200 len: 1893 time: 0.2476",
]


@pytest.fixture(scope="module")
def tokenizer() -> LineTokenizer:
    lines = generate_lines(600, seed=3).lines + LOGHUB_LIKE
    return LineTokenizer(train_tokenizer([NORMALIZER.mask(line) for line in lines], vocab_size=400))


def _nll_for(tokenizer: LineTokenizer, masked: str, hot: dict[str, float]) -> tuple[list, np.ndarray]:
    """Token offsets of `masked`, and surprisal 0.1 everywhere except tokens overlapping the
    first occurrence of each `hot` substring (which get the given nats, split over its tokens)."""
    offsets = line_token_offsets(tokenizer, masked)
    nll = np.full(len(offsets), 0.1)
    for needle, nats in hot.items():
        at = masked.index(needle)
        inside = [i for i, (s, e) in enumerate(offsets) if s < at + len(needle) and at < e]
        nll[inside] = nats / len(inside)
    return offsets, nll


@pytest.mark.parametrize("line", [*generate_lines(200, seed=5, incidents=INCIDENT_KINDS).lines, *LOGHUB_LIKE])
def test_mask_with_map_reproduces_the_normalizer(line: str) -> None:
    """The replayed masking gives exactly Normalizer.mask's text, one source span per masked char."""
    masked, spans = mask_with_map(DEFAULT_RULES, line)
    assert masked == NORMALIZER.mask(line)
    assert len(spans) == len(masked)


def test_masked_value_maps_back_to_its_original_text() -> None:
    """A placeholder's characters map to the value it replaced (`<IP>` -> 10.0.0.5:8080)."""
    line = LOGHUB_LIKE[3]
    masked, spans = mask_with_map(DEFAULT_RULES, line)
    at = masked.index("<IP>")
    start, end = spans[at][0], spans[at + 3][1]
    assert line[start:end] == "10.0.0.5:8080"


def test_bpe_pieces_of_one_word_are_one_word(tokenizer: LineTokenizer) -> None:
    """A word split into several tokens is explained once, with the sum of their surprisal."""
    line = "2026-11-02T08:00:00.124Z worker-2 INFO job 3136: unexpectedly quarantined queue=batch"
    masked = NORMALIZER.mask(line)
    offsets, nll = _nll_for(tokenizer, masked, {"quarantined": 12.0})
    assert sum(1 for s, e in offsets if masked.index("quarantined") <= s < masked.index(" queue")) > 1
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll, stream="worker-2")
    assert explanation.words[0].text == "quarantined"
    assert explanation.words[0].nats == pytest.approx(12.0 + 0.1, abs=0.11)  # its pieces, plus its space's
    assert "**quarantined**" in explanation.marked


def test_whitespace_and_punctuation_never_explain(tokenizer: LineTokenizer) -> None:
    """The most surprising tokens are a space, `=` and the newline: no word is named for them."""
    line = "2026-11-02T08:00:01.002Z web-0 INFO http: POST /api/carts/55201 status=200 bytes=8510 ms=50"
    masked = NORMALIZER.mask(line)
    offsets = line_token_offsets(tokenizer, masked)
    pieces = [(masked + "\n")[s:e].strip() for s, e in offsets]
    nll = np.array([9.0 if piece in ("", "=", ":") else 0.1 for piece in pieces])
    assert (nll == 9.0).sum() >= 3
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll, stream="web-0")
    assert explanation.words == ()
    assert "no single word stands out" in explanation.summary


def test_unseen_value_is_named_with_its_field(tokenizer: LineTokenizer) -> None:
    """`status=503`: the value is the explanation, highlighted in the line's template."""
    line = "2026-11-02T08:00:04.364Z web-1 INFO http: DELETE /api/items/2908 status=503 bytes=1192 ms=3"
    masked = NORMALIZER.mask(line)
    offsets, nll = _nll_for(tokenizer, masked, {"503": 8.0})
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll, stream="web-1")
    assert [w.text for w in explanation.words] == ["503"]
    assert "status=**503**" in explanation.marked
    assert "<PATH>" in explanation.template  # the rest of the line stays the template
    assert explanation.words[0].reason == "'503' here: 1 in 2,981"  # e**8


def test_stream_key_never_dominates(tokenizer: LineTokenizer) -> None:
    """The stream's own name in the line (host digits) is skipped, however surprising."""
    line = "web-17 INFO cache: evicted 454 keys under memory pressure"
    masked = NORMALIZER.mask(line)
    assert "web-17" in masked  # not masked here: the key itself reaches the model
    offsets, nll = _nll_for(tokenizer, masked, {"17": 20.0, "evicted": 5.0})
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll, stream="web-17")
    assert [w.text for w in explanation.words] == ["evicted"]


def test_masked_value_shows_original_and_says_it_was_masked(tokenizer: LineTokenizer) -> None:
    """A surprising `<IP>` shows the address, and the reason says the model saw only its kind."""
    line = LOGHUB_LIKE[3]
    masked = NORMALIZER.mask(line)
    offsets, nll = _nll_for(tokenizer, masked, {"<IP>": 9.0})
    word = explain_line(line, DEFAULT_RULES, masked, offsets, nll).words[0]
    assert (word.text, word.masked) == ("10.0.0.5:8080", "<IP>")
    assert "the model sees only the kind, not" in word.reason


def test_detector_explains_anomalies_in_words(synthetic_model_dir: Path) -> None:
    """End to end: every anomaly of the synthetic incident log carries an explanation whose words
    are words of the line (never blank, punctuation or the stream key), and normal lines none."""
    log = generate_lines(600, seed=7, incidents=INCIDENT_KINDS * 2)
    detector = Detector.load(synthetic_model_dir, device="cpu", false_alarm_rate=5e-3)
    scored = detector.score(parse_lines(log.lines, STREAM_KEY))
    anomalies = [s for s in scored if s.is_anomaly]
    assert anomalies and all(s.explanation is None for s in scored if not s.is_anomaly)
    for s in anomalies:
        assert s.explanation is not None
        for word in s.explanation.words:
            assert re.search(r"\w", word.text) and s.record.line[word.start : word.end] == word.text
            assert s.record.stream not in word.text
    unseen = [s for s, kind in zip(scored, log.kinds, strict=True) if kind == "unseen_value" and s.is_anomaly]
    assert unseen and any("503" in [w.text for w in s.explanation.words] for s in unseen)


def test_a_short_stream_name_skips_only_itself(tokenizer: LineTokenizer) -> None:
    """Stream `1` (key `worker-(\\d+)`) skips the `worker-1` word, not every word holding a 1."""
    line = "worker-1 INFO job finished in 17s"
    masked = NORMALIZER.mask(line)
    offsets, nll = _nll_for(tokenizer, masked, {"worker-1": 30.0, "17s": 6.0})
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll, stream="1")
    assert [w.text for w in explanation.words] == ["17s"]


def test_a_long_line_is_compacted_around_its_words(tokenizer: LineTokenizer) -> None:
    """A 700-character line shows its surprising word with some context, not the whole line."""
    line = "gmetad: failed to resolve " + " ".join(f"an{i}" for i in range(100, 220))
    masked = NORMALIZER.mask(line)
    offsets, nll = _nll_for(tokenizer, masked, {"an110": 20.0})  # early: a long line is cut at 256 tokens
    explanation = explain_line(line, DEFAULT_RULES, masked, offsets, nll)
    compact = explanation.compact(240, keep=40)
    assert ("an110", True) in compact
    assert sum(len(text) for text, _ in compact) < 200 < len(line)
    assert explanation.compact(10_000) == explanation.segments


@pytest.mark.parametrize(("burst", "said"), [(3.0, "once in 1,000)"), (60.0, "once in 10^60)"), (1.0, None)])
def test_a_burst_is_named_in_the_summary_by_its_rarity(burst: float, said: str | None) -> None:
    """A burst's rarity reads like a word's chance: a number, or a power of ten when tiny; one
    more common than BURST_SHOWN is not named."""
    summary = Explanation("x", (), (("x", False),), burst=burst).summary
    assert (said in summary) if said else "burst" not in summary


@pytest.mark.parametrize(
    ("rarity", "novel", "said"), [(2.5, False, "1 in 316 so far"), (1.0, False, None), (4.0, True, None)]
)
def test_a_rare_template_is_named_unless_it_is_new(rarity: float, novel: bool, said: str | None) -> None:
    """A template rare among the lines so far is named with its odds; a template new to the
    model is named as new (its rarity says no more), and a common one not at all."""
    explanation = Explanation("x", (), (("x", False),), novel=novel, rarity=rarity)
    assert (said in explanation.summary) if said else "rare" not in explanation.summary
    assert explanation.to_json()["rarity"] == rarity
