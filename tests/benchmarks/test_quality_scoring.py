"""benchmarks/quality.py scores a session as replay does (`Detector.score_streams`): the
session's end is one of the items its alert can show, so a session whose lines operators
marked normal still alerts when it stops where normal sessions never do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from benchmarks_support import load_benchmark

from logstream.lifecycle.feedback import Feedback, FeedbackRules, FeedbackStore
from logstream.scoring.calibration import HeldOut, fit_heldout
from logstream.scoring.config import ScoringConfig
from logstream.scoring.evidence import SESSION_TOP_K

quality = load_benchmark("quality")
TEMPLATE = "Receiving block <*> from datanode <*>"


def test_a_session_marked_normal_line_by_line_still_alerts_on_its_end(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    held_out = [
        HeldOut(
            [float(x) for x in rng.exponential(0.5, 20)],
            [None] * 20,
            [None] * 20,
            end=float(rng.exponential(0.1)),
        )
        for _ in range(300)
    ]
    calibration = fit_heldout(ScoringConfig(line_top_k=SESSION_TOP_K), held_out)
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    store.add(Feedback("normal", TEMPLATE, target=f"template:{TEMPLATE}", created_by="operator"))
    rules = FeedbackRules(store, refresh_seconds=0.0)

    def flagged(end: float) -> bool:
        session = quality.StreamOutput(
            "blk_1", [TEMPLATE] * 2, [TEMPLATE] * 2, [np.full(4, 0.2, dtype=np.float32)] * 2, [None] * 2, end
        )
        outputs = quality.Outputs([], [session], [TEMPLATE], [1], [])
        return bool(quality.score(calibration, outputs, True, rules).flagged[0])

    assert calibration.end_score(9.0) > calibration.threshold() + 2
    assert flagged(9.0)  # its lines are no evidence, its end is
    assert not flagged(0.05)
