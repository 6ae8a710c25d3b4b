"""The second line statistic: each token's NLL capped at `token_cap` x ln V, the top 6 words.

A small model given text it never saw spikes a token or two far past any useful surprise.
Uncapped, those spikes fill the normal lines' tail, and an incident whose six words are all
unlikely ranks below them. Each statistic has its own tail and a line scores the larger,
so the lines with one wildly unlikely token (HDFS, the demo) are still caught by the first.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from logstream.detector import line_evidence
from logstream.scoring import Calibration, Observation, ScoringConfig, fit_calibration, top_mean

V = 1000  # vocabulary: ln V = 6.9 nats, the cap 1.25 ln V = 8.6
WORDS = 10


def observe(config: ScoringConfig, nll: np.ndarray) -> Observation:
    """What the detector sees of a line of one-token words with these NLLs (no priors)."""
    starts = np.ones(len(nll), dtype=bool)
    evidence = line_evidence(Calibration(config=config), nll, "a line", word_starts=starts, vocab_size=V)
    return Observation(evidence.surprisal, None, False, capped=evidence.capped)


def normal_lines(n: int, seed: int) -> list[np.ndarray]:
    """Words of about 1 nat; one line in 5 has a token the model is far too sure against (a
    new id or host it never saw: 6 nats on average, some past 30), as a tiny model's lines do."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        nll = rng.exponential(1.0, WORDS)
        if rng.random() < 0.2:
            nll[rng.integers(WORDS)] = rng.exponential(6.0)
        lines.append(nll)
    return lines


def calibrated(config: ScoringConfig) -> Calibration:
    return fit_calibration(config, [observe(config, nll) for nll in normal_lines(3000, seed=0)], [])


def score(calibration: Calibration, nll: np.ndarray) -> float:
    seen = observe(calibration.config, nll)
    return calibration.line_score(calibration.evidence(seen), capped=calibration.capped_evidence(seen))


BROAD = np.array([7.0] * 6 + [1.0] * 4)  # six unlikely words (an OOM kill the model never saw)
WILD = np.array([80.0] + [1.0] * 9)  # one token far past any normal spike (a broken HDFS block)


def test_the_capped_statistic_caps_each_token_and_takes_six_words() -> None:
    """The 30-nat token counts 1.25 ln V there and fully in the first statistic's top 3."""
    nll = np.array([30.0, 1.0, 8.0, 8.0, 8.0, 8.0, 8.0, 0.5])
    cap = 1.25 * math.log(V)
    seen = observe(ScoringConfig(), nll)
    assert seen.surprisal == pytest.approx((30 + 8 + 8) / 3)
    assert seen.capped == pytest.approx((cap + 5 * 8) / 6)
    assert seen.capped == top_mean(np.minimum(nll, cap), 6)  # one-token words: capped tokens
    assert observe(ScoringConfig(capped_top_k=0), nll).capped is None
    with pytest.raises(ValueError, match="vocab_size"):
        line_evidence(Calibration(), nll, "a line", word_starts=np.ones(len(nll), dtype=bool))


def test_the_two_tails_catch_what_each_alone_misses() -> None:
    """Six unlikely words: below the uncapped tail (normal spikes fill it), far out in the
    capped one. One wild token: the reverse. The line scores the larger of the two."""
    both, one = calibrated(ScoringConfig()), calibrated(ScoringConfig(capped_top_k=0))
    threshold = both.threshold()
    assert one.threshold() == threshold  # the same unit: -log10 of the target rate
    assert score(one, BROAD) < threshold < score(both, BROAD)
    assert score(one, WILD) > threshold and score(both, WILD) == score(one, WILD)
    assert both.capped.score(both.capped_evidence(observe(both.config, WILD))) < threshold


def test_a_normal_line_passes_a_threshold_at_most_twice_its_rate() -> None:
    """Each tail passes a fresh normal line at rate p; the larger of the two at most 2p (and
    at least p). Rate 1e-2 here, so that 20,000 fresh lines measure it."""
    calibration = calibrated(ScoringConfig())
    fresh = normal_lines(20_000, seed=1)
    passed = np.mean([score(calibration, nll) > 2.0 for nll in fresh])
    assert 0.5e-2 < passed < 2 * 1.25e-2, passed


def test_a_saved_calibration_keeps_both_tails_and_older_ones_keep_one() -> None:
    calibration = calibrated(ScoringConfig())
    loaded = Calibration.from_json(calibration.to_json())
    assert loaded.to_json() == calibration.to_json() and loaded.capped is not None
    assert score(loaded, BROAD) == pytest.approx(score(calibration, BROAD), abs=1e-4)
    saved = calibration.to_json()
    for name in ("capped", "capped_reference"):
        del saved[name]
    del saved["config"]["capped_top_k"]
    older = Calibration.from_json(saved)  # saved before the capped statistic: its one tail
    assert older.config.capped_top_k == 0 and older.capped is None
    assert score(older, BROAD) < older.threshold()
    with pytest.raises(ValueError, match="capped_top_k"):
        ScoringConfig(capped_top_k=-1)
    with pytest.raises(ValueError, match="token_cap"):
        ScoringConfig(token_cap=0.0)


def test_train_turns_the_second_statistic_off() -> None:
    """`train --capped-top-k 0` is the one-statistic score (the ablation); the default keeps 6."""
    from logstream.cli import _train_config

    assert _train_config("tiny", None, 0, 2.0, 200, 2000, capped_top_k=0).scoring.capped_top_k == 0
    assert _train_config("tiny", None, 0, 2.0, 200, 2000).scoring.capped_top_k == 6
