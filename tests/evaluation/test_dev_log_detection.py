"""Detection on a dev log of the quality benchmark: a real log with injected incidents, and a
baseline contaminated with a recurring failure (logstream.evaluation.injection).

One model, trained with `train`'s defaults on the baseline half of loghub's ZooKeeper sample,
whose baseline repeats a JVM's `OutOfMemoryError` (FATAL) about 3% of its lines.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from loghub_support import LOGHUB

from logstream.consumers.inputs import streams_from_lines
from logstream.detector import Detector
from logstream.evaluation.injection import dev_log
from logstream.lifecycle.train import TrainConfig, train
from logstream.records import LogRecord

ZOOKEEPER = LOGHUB / "Zookeeper_2k.log"
RATES = (1e-4, 3e-4, 1e-3, 3e-3)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ZOOKEEPER.is_file(), reason=f"shared loghub data not found at {ZOOKEEPER}"),
]


@pytest.fixture(scope="module")
def dev() -> tuple[Detector, list[str], list[str | None]]:
    """The trained detector, the scored half's lines and each line's injected kind."""
    lines = ZOOKEEPER.read_text(encoding="utf-8", errors="replace").splitlines()
    log = dev_log("Zookeeper", lines, seed=0, recurring="oom")
    trained = train(streams_from_lines(log.baseline), TrainConfig())
    detector = Detector(trained.model, trained.tokenizer, trained.meta, device="cpu")
    return detector, log.scored, log.kinds


def scored(detector: Detector, lines: list[str], threshold: float | None = None) -> list:
    detector.reset()
    detector.fixed_threshold = threshold
    return detector.score([LogRecord(line=line) for line in lines])


def test_a_recurring_failure_of_the_baseline_still_alerts(dev: tuple) -> None:
    """The baseline repeats the OOM failure, so the model learned it as ordinary; when it
    recurs in the scored half its FATAL lines still alert (a critical level is the axis
    training and calibration cannot learn away), while the normal lines stay quiet but for
    one burst: at the default rate (1e-3) 51 of its 1,000 normal lines alert, all a WARN
    line that says "error" (`Connection broken for id ...`), written in a burst by the
    ZooKeeper server itself."""
    detector, lines, kinds = dev
    result = scored(detector, lines)
    oom = [s for s, kind in zip(result, kinds, strict=True) if kind == "oom" and s.level == "critical"]
    assert oom and all(s.is_anomaly for s in oom), [(s.score, s.record.line) for s in oom]
    normal = [s for s, kind in zip(result, kinds, strict=True) if kind is None and s.is_anomaly]
    assert len(normal) < 0.06 * kinds.count(None)
    assert len({s.template for s in normal}) <= 1, Counter(s.template for s in normal)


def test_alert_counts_move_gradually_between_adjacent_rates(dev: tuple) -> None:
    """Between adjacent false-alarm rates (each ~3.2x the one before) the number of alerts
    grows, never by more than 4x plus a few lines: no cliff where a run of lines shares one
    capped score."""
    detector, lines, _ = dev
    counts = [sum(s.is_anomaly for s in scored(detector, lines, -np.log10(rate))) for rate in RATES]
    assert counts == sorted(counts) and counts[-1] > counts[0], counts
    assert all(b <= 4 * a + 5 for a, b in itertools.pairwise(counts)), counts


def test_no_score_is_shared_by_several_templates(dev: tuple) -> None:
    """Scores do not plateau: among the lines over the loosest threshold, no score value is
    shared by lines of more than one template (a cap beyond the largest held-out sample made
    90 unseen lines of many templates score exactly the same)."""
    detector, lines, _ = dev
    alerting = [s for s in scored(detector, lines, -np.log10(RATES[-1])) if s.is_anomaly]
    templates_per_score = Counter(score for score, _ in {(round(s.score, 6), s.template) for s in alerting})
    assert alerting and max(templates_per_score.values()) == 1, templates_per_score.most_common(3)
