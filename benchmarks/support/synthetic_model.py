"""The synthetic model that the tests and the Kafka benchmarks score with.

tiny preset, window 128, 1,000 steps on 4,000 clean lines of the synthetic system
(`logstream.evaluation.synth`, seed 1): good enough to catch every synthetic incident kind
(tests/evaluation/test_detection.py), about a minute on 2 cores. Training is deterministic, so every
caller gets the same weights.
"""

from __future__ import annotations

from pathlib import Path


def train_synthetic_model(out: Path) -> Path:
    """Train the model and save it as a model directory at `out`; returns `out`."""
    from logstream.consumers.inputs import streams_from_lines
    from logstream.evaluation.synth import STREAM_KEY, generate_lines
    from logstream.lifecycle.train import TrainConfig, save, train

    streams = streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY)
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=1000, batch_size=16)
    save(train(streams, config), out)
    return out
