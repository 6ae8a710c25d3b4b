"""Template centering (a switch, off by default): a known template's lines are judged
against that template's usual surprise in the held-out baseline, not against all lines.

It raised AUC-PR on the raw-log dev sets and is off by default because it also learns
what the baseline repeats (docs/quality.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from logstream.detector import Detector
from logstream.inputs import streams_from_lines
from logstream.records import LogRecord
from logstream.scoring import CENTER_MIN_LINES, CENTER_SHRINK, Calibration, ScoringConfig, template_offsets
from logstream.synth import STREAM_KEY, generate_lines
from logstream.train import calibrate


def test_offsets_are_a_templates_shrunk_excess_over_the_median_line() -> None:
    """Template 1 is routinely surprising (10 lines near 8 nats), template 2 is the bulk
    (50 lines near 2 nats), template 3 has too few lines to say, None is a new template."""
    rng = np.random.default_rng(7)
    t1, t2 = list(8 + rng.normal(0, 0.3, 10)), list(2 + rng.normal(0, 0.3, 50))
    templates = [1] * 10 + [2] * 50 + [3] * (CENTER_MIN_LINES - 1) + [None] * 5
    evidence = [*t1, *t2, *[9.0] * (CENTER_MIN_LINES - 1), *[9.5] * 5]
    offsets, centered = template_offsets(templates, evidence)
    center = float(np.median(evidence))
    assert set(offsets) == {1}  # 2 is below the median line, 3 has too few lines
    assert offsets[1] == pytest.approx((float(np.median(t1)) - center) * 10 / (10 + CENTER_SHRINK))
    for i, value in enumerate(t1):  # each line is centered by its template's offset without itself
        others = t1[:i] + t1[i + 1 :]
        expected = (float(np.median(others)) - center) * 9 / (9 + CENTER_SHRINK)
        assert centered[i] == pytest.approx(value - expected)
    assert centered[10:] == evidence[10:]  # nothing else moves


def test_offsets_round_trip_through_the_saved_calibration() -> None:
    calibration = Calibration(template_offsets={3: 1.25, 281474976710655: 0.5})
    loaded = Calibration.from_json(json.loads(json.dumps(calibration.to_json())))
    assert loaded.template_offsets == {3: 1.25, 281474976710655: 0.5}
    older = calibration.to_json()
    del older["template_offsets"]  # a model saved before centering existed
    assert Calibration.from_json(older).template_offsets == {}
    with pytest.raises(ValueError, match="template_offsets"):
        Calibration.from_json({**calibration.to_json(), "template_offsets": {"3": float("nan")}})


def test_a_known_template_is_judged_against_its_usual_surprise(synthetic_model_dir: Path) -> None:
    """Recalibrated with centering on: lines of a template the baseline knows lose that
    template's offset; a template never seen keeps its whole evidence and still alerts."""
    detector = Detector.load(synthetic_model_dir, device="cpu")
    assert detector.scoring.template_centering is False  # off by default
    heldout = streams_from_lines(generate_lines(1500, seed=43).lines, STREAM_KEY)
    calibration = calibrate(detector, heldout, replace(detector.scoring, template_centering=True))
    assert calibration.template_offsets, "no template of the synthetic baseline is routinely surprising"
    assert all(0 < t <= detector.known_clusters for t in calibration.template_offsets)

    scored = detector.score(
        [LogRecord(line=line, stream="web-0") for line in generate_lines(400, seed=44).lines]
    )
    centered = [s for s in scored if s.known_template in calibration.template_offsets]
    assert centered, "no scored line belongs to a centered template"
    for s in centered:
        prior = detector.scoring.severity_prior.get(s.level or "", 0.0)
        offset = calibration.template_offsets[s.known_template]
        assert s.raw == pytest.approx(s.surprisal + prior - offset)

    new = "2024-01-01T00:00:00.000Z web-0 ERROR db: connection pool exhausted (active=60, waiting=200)"
    (line,) = detector.score([LogRecord(line=new, stream="web-0")])
    assert line.known_template is None and line.novel
    assert line.raw == pytest.approx(line.surprisal + detector.scoring.severity_prior["error"])
    assert line.is_anomaly


def test_centering_is_a_saved_switch() -> None:
    assert ScoringConfig().template_centering is False
    with pytest.raises(TypeError, match="template_centering"):
        ScoringConfig(template_centering="yes")  # type: ignore[arg-type]
