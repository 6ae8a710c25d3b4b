"""`logstream train --from`: after a deploy that rewords three templates, a model continued on
old-format traffic plus the operators' "normal" verdicts on the new wording learns the new
wording, keeps catching the synthetic incidents its parent caught (its kept sample of old
data is replayed), and records its lineage (parent, data window, counts)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.detector import Detector, ScoredLine
from logstream.evaluation.synth import (
    INCIDENT_KINDS,
    STREAM_KEY,
    SyntheticLog,
    after_format_change,
    generate_lines,
)
from logstream.lifecycle.feedback import Feedback, FeedbackStore, template_of
from logstream.lifecycle.retrain import SAMPLE_LINES, continue_training, read_sample, write_sample
from logstream.lifecycle.train import TrainConfig, save
from logstream.text.normalize import Normalizer

REWORDED = re.compile(r"complete|status=healthy")  # the three templates the deploy changed


@pytest.fixture(scope="module")
def models(synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(parent, continued): the synthetic model with a sample of its own baseline kept, and
    that model continued on 1,500 lines of old-format traffic plus three example lines of each
    reworded line shape that an operator marked normal (nothing else shows the new wording)."""
    parent = tmp_path_factory.mktemp("retrain") / "v1"
    shutil.copytree(synthetic_model_dir, parent)
    write_sample(parent, streams_from_lines(generate_lines(4000, seed=1).lines, STREAM_KEY))
    normalizer = Normalizer.from_json(json.loads((parent / "logstream.json").read_text())["mask_rules"])
    db = parent.parent / "outbox.sqlite"
    store = FeedbackStore(db)
    seen: dict[str, int] = {}
    for line in after_format_change(generate_lines(300, seed=30)).lines:
        template = template_of(line, normalizer)
        if REWORDED.search(line) and seen.get(template, 0) < 3:
            seen[template] = seen.get(template, 0) + 1
            store.add(Feedback("normal", template, line=line, created_by="on-call"))
    store.close()
    assert len(seen) >= 3  # one per partition count too: "over 4 partitions" is its own line shape
    new = streams_from_lines(generate_lines(1500, seed=3).lines, STREAM_KEY)
    config = TrainConfig(preset="tiny", window=128, seed=0, max_steps=400, batch_size=16)
    trained, streams = continue_training(parent, new, config, feedback_db=db)
    out = parent.parent / "v2"
    save(trained, out)
    write_sample(out, streams)
    return parent, out


def _score(model: Path, log: SyntheticLog) -> list[ScoredLine]:
    detector = Detector.load(model, device="cpu", false_alarm_rate=5e-3)
    return detector.score(parse_lines(log.lines, STREAM_KEY))


def test_continued_model_learns_the_fed_back_wording_and_keeps_the_incidents(
    models: tuple[Path, Path],
) -> None:
    """Without any feedback rule at scoring time: the parent flags most reworded lines (all
    306 here), the continued model at most a third of them (74 of 306 on one thread, none on
    two: training keeps the weights of its best validation loss, and the shipped scoring
    does not refit the tail on lines that did not alert), and it still catches every
    incident kind the parent catches."""
    parent, continued = models
    log = after_format_change(generate_lines(1500, seed=7, incidents=INCIDENT_KINDS * 4))
    reworded = [
        i
        for i, (line, kind) in enumerate(zip(log.lines, log.kinds, strict=True))
        if kind is None and REWORDED.search(line)
    ]
    before, after = _score(parent, log), _score(continued, log)
    assert sum(before[i].is_anomaly for i in reworded) > len(reworded) / 2
    assert sum(after[i].is_anomaly for i in reworded) <= len(reworded) / 3
    for kind in INCIDENT_KINDS:
        lines = [i for i, k in enumerate(log.kinds) if k == kind]
        if any(before[i].is_anomaly for i in lines):
            assert any(after[i].is_anomaly for i in lines), f"{kind}: the continued model forgot it"


def test_continued_model_records_its_lineage(models: tuple[Path, Path]) -> None:
    """logstream.json names the parent, the new data's window and the counts of each part;
    the model keeps a bounded sample of what it trained on for its own successor."""
    _, continued = models
    meta = json.loads((continued / "logstream.json").read_text())
    assert meta["parent"].startswith("v1@") and meta["new_lines"] == 1500
    assert meta["feedback_examples"] >= 9 and meta["feedback_lines"] >= 150  # 10% of 1,500, at least
    assert meta["replayed_lines"] == 4000
    assert meta["data_window"]["first"] < meta["data_window"]["last"]
    assert 0 < sum(len(s.lines) for s in read_sample(continued)) <= SAMPLE_LINES
