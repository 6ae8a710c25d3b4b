"""The tokenizer's two kinds of merges: within words (the default) and across them
(`merge_across_words`, a speed lever: a common line becomes one token)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import logstream.engine.tokenizer as tokenizer_module
from logstream.detector import Detector
from logstream.engine.model import load_model_dir
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.evaluation.synth import STREAM_KEY, generate_lines
from logstream.records import LogRecord
from logstream.text.normalize import Normalizer

NORMALIZER = Normalizer()
BASELINE = [NORMALIZER.mask(line) for line in generate_lines(1500, seed=3).lines]
OOM = NORMALIZER.mask("kernel: Out of memory: Kill process 812 (java) score 901 or sacrifice child")
COMMON, _ = Counter(BASELINE).most_common(1)[0]  # the baseline's most common masked line


def tokenizers() -> tuple[LineTokenizer, LineTokenizer]:
    return (
        LineTokenizer(train_tokenizer(BASELINE, vocab_size=512)),
        LineTokenizer(train_tokenizer(BASELINE, vocab_size=512, merge_across_words=True)),
    )


def test_merges_across_words_make_the_common_lines_single_tokens() -> None:
    """Across words, the baseline's most common masked line is one token (its newline
    included) where word merges need one a word; unseen text still encodes, in more pieces,
    and every line decodes back to itself."""
    words, lines = tokenizers()
    assert len(lines.encode_lines([COMMON])[0]) == 1
    assert len(words.encode_lines([COMMON])[0]) >= len(COMMON.split())
    later = [NORMALIZER.mask(line) for line in generate_lines(500, seed=4).lines]
    per_line = [np.mean([len(ids) for ids in t.encode_lines(later)]) for t in (words, lines)]
    assert per_line[1] < per_line[0] / 3, per_line
    assert len(lines.encode_lines([OOM])[0]) > 1
    for line, ids in zip([*later, OOM], lines.encode_lines([*later, OOM]), strict=True):
        assert lines.hf.decode(ids) == line + "\n"


def test_a_token_of_several_words_is_one_word_of_the_line_score() -> None:
    """The line score's words (`word_starts`): a merged token that spans words counts once,
    so a one-token line is one word, and an unseen line, cut into small pieces, has the
    words it has under word merges."""
    words, lines = tokenizers()
    assert lines.word_starts(lines.encode_lines([COMMON])[0]).tolist() == [True]
    unseen = [t.word_starts(t.encode_lines([OOM])[0]) for t in (words, lines)]
    assert unseen[1].sum() == unseen[0].sum() > 10


def test_repeated_lines_get_the_ids_and_word_starts_of_a_fresh_tokenizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache of masked lines is exact: lines met before (in this batch or an earlier one,
    also after the cache was emptied for being full) get the ids and word starts a tokenizer
    that never saw them computes. A caller may change the ids it got without changing the
    next answer; the shared word starts cannot be written. The cache never holds more than
    CACHED_LINES lines, whatever one batch brings."""
    monkeypatch.setattr(tokenizer_module, "CACHED_LINES", 50)
    hf = train_tokenizer(BASELINE, vocab_size=512)
    later = [NORMALIZER.mask(line) for line in generate_lines(400, seed=5).lines]
    batches = [later[:120], later[60:300], later[:400], [OOM, OOM, *later[:3]]]  # repeats within and across
    cached = LineTokenizer(hf)
    for batch in batches:
        got = cached.encode_lines(batch)
        fresh = LineTokenizer(hf)  # a new cache: every line computed
        assert got == [fresh.encode_lines([line])[0] for line in batch]
        for ids in got:
            assert cached.word_starts(ids).tolist() == fresh.word_starts(ids).tolist()
        assert len(cached._ids) <= 50 and len(cached._starts) <= 50
    first = cached.encode_lines([OOM])[0]
    first.append(7)
    assert cached.encode_lines([OOM])[0] == first[:-1]
    starts = cached.word_starts(first[:-1])
    assert cached.word_starts(first[:-1]) is starts and not starts.flags.writeable


def test_train_merge_across_words_saves_a_model_that_scores_the_same_when_loaded(tmp_path: Path) -> None:
    """`logstream train --merge-across-words`: the saved tokenizer keeps its merges across
    words (a common line is one token after loading) and the config says so; two loads of
    the model score alike, with finite scores."""
    baseline_lines = generate_lines(800, seed=11).lines
    baseline = tmp_path / "baseline.log"
    baseline.write_text("\n".join(baseline_lines) + "\n")
    out = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "train", str(baseline), "--out", str(out), "--preset", "tiny",
         "--window", "64", "--max-steps", "20", "--stream-key", STREAM_KEY, "--merge-across-words"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "logstream.json").read_text())
    assert meta["train_config"]["merge_across_words"] is True
    assert meta["train_tokens"] < 4 * meta["train_lines"]  # words take ~20 tokens a line
    model, tokenizer, meta = load_model_dir(out)
    common, _ = Counter(NORMALIZER.mask(line) for line in baseline_lines).most_common(1)[0]
    assert len(tokenizer.encode_lines([common])[0]) == 1
    records = [LogRecord(line=line, stream="web") for line in generate_lines(200, seed=12).lines]
    first = Detector(model, tokenizer, meta).score(records)
    again = Detector(*load_model_dir(out)).score(records)
    assert [s.score for s in first] == [s.score for s in again]
    assert all(np.isfinite(s.score) for s in first)


SSHD = [f"sshd[{i}]: Accepted password for user{i % 7} from host port {i * 13}" for i in range(200)]


@pytest.fixture(scope="module")
def sshd_tokenizer() -> LineTokenizer:
    return LineTokenizer(train_tokenizer(SSHD, vocab_size=300))


def words_of(tokenizer: LineTokenizer, line: str) -> list[str]:
    ids = tokenizer.encode_lines([line])[0]
    starts = tokenizer.word_starts(ids)
    words: list[str] = []
    for token, start in zip(ids, starts, strict=True):
        if start:
            words.append("")
        words[-1] += tokenizer.token_text(token)
    return words


def test_an_unseen_word_cut_into_pieces_is_one_word(sshd_tokenizer: LineTokenizer) -> None:
    """`sacrifice` never occurred in the baseline: BPE cuts it into pieces, `word_starts` joins
    them; letters, digits and punctuation are separate words, as the pre-tokenizer splits them."""
    line = "kernel: Out of memory: Kill process 16986 (java) score or sacrifice child"
    assert len(sshd_tokenizer.encode_lines([" sacrifice"])[0]) > 2  # " sacrifice\n": pieces and the newline
    assert words_of(sshd_tokenizer, line) == [
        "kernel", ":", " Out", " of", " memory", ":", " Kill", " process", " 16986", " (", "java", ")",
        " score", " or", " sacrifice", " child", "\n",
    ]  # fmt: skip
    assert words_of(sshd_tokenizer, "sshd[12]: Accepted") == ["sshd", "[", "12", "]:", " Accepted", "\n"]
