"""A storm on one host of a per-host baseline alerts by its burst (the demo's system).

Each host of the baseline writes a few hundred lines, so each holds out fewer lines than the
128-line horizon a burst is counted over; the held-out tails count after the lines their hosts
wrote in training, so the model still gets a burst tail (`train.lines_before`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.demo import BASELINE_LINES, INCIDENT_LOG_LINES
from logstream.detector import Detector, ScoredLine
from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, SyntheticLog, generate_lines
from logstream.lifecycle.train import TrainConfig, heldout_split, train
from logstream.scoring.bursts import HORIZON


@pytest.fixture(scope="module")
def demo() -> tuple[Detector, SyntheticLog]:
    """The demo's model (its baseline, preset, window and steps) and its incident log."""
    baseline = streams_from_lines(generate_lines(BASELINE_LINES, seed=1).lines, STREAM_KEY)
    config = TrainConfig(preset="tiny", window=128, max_steps=600, stream_key=STREAM_KEY)
    assert all(len(s.lines) < HORIZON for s in heldout_split(baseline, config)[1])
    trained = train(baseline, config)
    log = generate_lines(INCIDENT_LOG_LINES, seed=7, incidents=INCIDENT_KINDS * 2, incident_start=0.2)
    return Detector(trained.model, trained.tokenizer, trained.meta, device="cpu"), log


def storm_lines(detector: Detector, log: SyntheticLog) -> list[ScoredLine]:
    detector.reset()
    scored = detector.score(parse_lines(log.lines, STREAM_KEY))
    return [s for s, kind in zip(scored, log.kinds, strict=True) if kind == "burst"]


@pytest.mark.slow
def test_a_storm_on_one_host_alerts_by_its_burst(demo: tuple[Detector, SyntheticLog]) -> None:
    """Twelve cache evictions in a row on one host: each line is a WARN the baseline knows, and
    by its words alone none alerts (as none did when such a model had no burst tail); with
    its burst, most do, as warnings (a burst of ordinary lines is never critical)."""
    detector, log = demo
    assert detector.calibration.burst is not None
    storm = storm_lines(detector, log)
    alerting = [k for k, s in enumerate(storm) if s.is_anomaly]
    assert len(alerting) > len(storm) / 2
    assert all(storm[k].severity == "warning" for k in alerting)
    calibration = detector.calibration
    try:
        detector.calibration = replace(calibration, burst=None)
        assert not any(s.is_anomaly for s in storm_lines(detector, log))
    finally:
        detector.calibration = calibration
