"""The line score counts words, not BPE pieces: an unseen word fills one of the top-k places.

A byte-level BPE cuts a word it never saw into several rare pieces; a top 3 of tokens was
then filled by one new name, so a line with one new word scored like a line of three
(docs/quality.md measures the change on the dev sets).
"""

from __future__ import annotations

import numpy as np
import pytest

from logstream.cli import LineUnit
from logstream.detector import line_evidence
from logstream.scoring import LINE_UNITS, Calibration, ScoringConfig, line_units, surprising_tokens, top_mean
from logstream.tokenizer import LineTokenizer, train_tokenizer

BASELINE = [f"sshd[{i}]: Accepted password for user{i % 7} from host port {i * 13}" for i in range(200)]


@pytest.fixture(scope="module")
def tokenizer() -> LineTokenizer:
    return LineTokenizer(train_tokenizer(BASELINE, vocab_size=300))


def words_of(tokenizer: LineTokenizer, line: str) -> list[str]:
    ids = tokenizer.encode_lines([line])[0]
    starts = tokenizer.word_starts(ids)
    words: list[str] = []
    for token, start in zip(ids, starts, strict=True):
        if start:
            words.append("")
        words[-1] += tokenizer.token_text(token)
    return words


def test_an_unseen_word_cut_into_pieces_is_one_word(tokenizer: LineTokenizer) -> None:
    """`sacrifice` never occurred in the baseline: BPE cuts it into pieces, `word_starts` joins
    them; letters, digits and punctuation are separate words, as the pre-tokenizer splits them."""
    line = "kernel: Out of memory: Kill process 16986 (java) score or sacrifice child"
    assert len(tokenizer.encode_lines([" sacrifice"])[0]) > 2  # " sacrifice\n": pieces and the newline
    assert words_of(tokenizer, line) == [
        "kernel", ":", " Out", " of", " memory", ":", " Kill", " process", " 16986", " (", "java", ")",
        " score", " or", " sacrifice", " child", "\n",
    ]  # fmt: skip
    assert words_of(tokenizer, "sshd[12]: Accepted") == ["sshd", "[", "12", "]:", " Accepted", "\n"]


def test_top_k_of_words_takes_each_word_once() -> None:
    """Three rare pieces of one word: the top 3 of tokens is that word alone (11 nats), the
    top 3 of words is that word and the two next most surprising ones."""
    nll = np.array([12.0, 11.0, 10.0, 1.0, 2.0, 0.5])
    starts = np.array([True, False, False, True, True, True])
    assert top_mean(line_units(nll), 3) == pytest.approx(11.0)
    assert top_mean(line_units(nll, starts), 3) == pytest.approx((12.0 + 2.0 + 1.0) / 3)
    assert top_mean(line_units(nll, starts), 0) == pytest.approx((12.0 + 1.0 + 2.0 + 0.5) / 4)
    assert top_mean(line_units(np.array([]), np.array([], dtype=bool)), 3) == 0.0
    one = np.array([7.123456789], dtype=np.float32)  # a whole line as one token: its own NLL, exactly
    assert top_mean(line_units(one, np.array([True])), 3) == top_mean(one, 0) == float(one[0])
    assert surprising_tokens(nll) == ((0, 12.0), (1, 11.0), (2, 10.0))  # explanations: tokens


def test_top_mean_is_numpys_mean_of_the_top_k_bit_for_bit() -> None:
    """`top_mean` sorts in Python for speed; its value is numpy's mean of the k largest, largest
    first, in the units' dtype, to the last bit (ties, k beyond the length, float32 and float64)."""
    rng = np.random.default_rng(0)
    for case in range(3000):
        n, k = int(rng.integers(2, 30)), int(rng.choice([0, 1, 3, 6, 40]))
        units = rng.random(n) * rng.choice([0.01, 1.0, 20.0])
        units = np.round(units, 1) if case % 3 == 0 else units  # ties
        units = units.astype(np.float32 if case % 2 else np.float64)
        want = np.mean(np.sort(units)[::-1][:k] if k else units)
        assert top_mean(units, k) == float(want), (units, k)


def test_words_are_the_default_and_older_models_keep_tokens() -> None:
    """New models count words; a calibration saved before `line_unit` existed was fitted on
    token scores and keeps them; an unknown unit is refused; a word score needs word starts."""
    assert ScoringConfig().line_unit == "word" == LineUnit.word  # `train --line-unit` offers LINE_UNITS
    assert [unit.value for unit in LineUnit] == list(LINE_UNITS)
    saved = Calibration(config=ScoringConfig(line_unit="token")).to_json()
    del saved["config"]["line_unit"]
    assert Calibration.from_json(saved).config.line_unit == "token"
    with pytest.raises(ValueError, match="line_unit"):
        ScoringConfig(line_unit="byte")
    with pytest.raises(ValueError, match="word_starts"):
        line_evidence(Calibration(), np.array([1.0, 2.0]), "a line")
    evidence = line_evidence(
        Calibration(), np.array([1.0, 2.0]), "a line", word_starts=np.array([True, False]), vocab_size=300
    )
    assert evidence.surprisal == pytest.approx(2.0)
