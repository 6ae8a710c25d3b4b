"""`logstream train --from MODEL`: continue a model on new data without forgetting the old.

A continued model starts from the earlier one's weights, tokenizer, masking and pattern
prompt (`train(..., start_from=...)`, the same path as replay's prequential chunks) and
trains on three parts:

- the new baseline (recent traffic: what the system logs now, e.g. after a deploy);
- lines like those operators marked normal (`logstream feedback normal`), mixed into the
  new streams at random places, many of them, their values varied as the examples vary
  (`mix_in`, `variants`);
- a replay of the old data: every model directory keeps a bounded sample of the streams it
  was trained on (SAMPLE_FILE, at most SAMPLE_LINES lines, written at train time), so a
  continued model sees old patterns again and does not forget them.

The new model's logstream.json says what it learned: `parent` (the model id it continued
from), `data_window` (first and last event time of the new data, when its lines carry
timestamps), `data_sha256` and the counts (`train_lines`, `feedback_lines`,
`replayed_lines`).

Dynamic sinks (`refresh_prompt`, `train --from MODEL --prompt-only`): the same weights with
the pattern prompt (the attention sinks) rebuilt from the templates now common in the new
data, recalibrated on its held-out lines. Like a continued model it is a new version, shadowed
and promoted through the model store, never an edit in place.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

from logstream.detector import Detector
from logstream.engine.model import ModelDirError, load_model_dir, model_id
from logstream.lifecycle.feedback import FeedbackStore, latest_verdicts
from logstream.lifecycle.train import (
    Stream,
    TrainConfig,
    Trained,
    calibrate,
    data_sha256,
    heldout_split,
    train,
)
from logstream.scoring.calibration import Calibration
from logstream.scoring.quiet import learn_baseline
from logstream.text.event_time import line_time
from logstream.text.normalize import Normalizer
from logstream.text.patterns import MAX_TEMPLATES, mine, pattern_prompt

SAMPLE_FILE = "baseline_sample.jsonl"
SAMPLE_LINES = 4000  # the old data a model keeps for its successors (consecutive lines per stream)
FEEDBACK_REPEATS = 20  # times each feedback example is mixed in, at least
FEEDBACK_SHARE = 0.1  # of the new lines: the normal templates' lines together, at least
_DIGITS = re.compile(r"\d+")  # numbers the masking left (small ones: counts, codes, ms)


def sample_streams(streams: list[Stream], max_lines: int = SAMPLE_LINES) -> list[Stream]:
    """A bounded sample that keeps context: each stream's last lines, in proportion to its size."""
    total = sum(len(s.lines) for s in streams)
    if total <= max_lines:
        return [s for s in streams if s.lines]
    out = []
    for s in streams:
        keep = len(s.lines) * max_lines // total
        if keep:
            out.append(Stream(s.name, s.lines[-keep:], s.ended))
    return out


def write_sample(model_dir: Path, streams: list[Stream]) -> int:
    """Keep a bounded sample of the training streams in the model directory; its line count."""
    sample = sample_streams(streams)
    with (model_dir / SAMPLE_FILE).open("w", encoding="utf-8") as f:
        for s in sample:
            f.write(json.dumps({"stream": s.name, "lines": s.lines, "ended": s.ended}) + "\n")
    return sum(len(s.lines) for s in sample)


def read_sample(model_dir: Path) -> list[Stream]:
    """The old data kept with a model ([] for a model from before samples were kept)."""
    path = model_dir / SAMPLE_FILE
    if not path.is_file():
        return []
    out = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            item = json.loads(text)
            out.append(Stream(str(item["stream"]), [str(x) for x in item["lines"]], bool(item["ended"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelDirError(f"{path}:{number}: damaged sample line ({type(exc).__name__})") from None
    return out


def feedback_examples(database: Path) -> dict[str, list[str]]:
    """Template -> its distinct example lines, for templates whose latest verdict is "normal"."""
    store = FeedbackStore(database)
    try:
        feedback = store.listed()
    finally:
        store.close()
    normal = {t for t, v in latest_verdicts(feedback).items() if v == "normal"}
    out: dict[str, list[str]] = {}
    for f in feedback:
        if f.template in normal and f.line and f.line not in out.setdefault(f.template, []):
            out[f.template].append(f.line)
    return out


def variants(examples: list[str], count: int, rng: random.Random) -> list[str]:
    """`count` lines like the (masked) examples of one template: a number on which the examples
    disagree is a value, drawn anew from the range they span; one they agree on stays.

    A verdict says "these lines are normal", not "these exact values are": repeating the same
    few values would teach the model those values, and the next line of the pattern, with
    other numbers, would alert again."""
    runs = [[int(d) for d in _DIGITS.findall(line)] for line in examples]
    if len({len(r) for r in runs}) != 1:  # the examples differ in shape: repeat them as they are
        return [examples[i % len(examples)] for i in range(count)]
    spans = [(min(column), max(column)) for column in zip(*runs, strict=True)]
    out = []
    for i in range(count):
        drawn = iter([rng.randint(lo, hi) for lo, hi in spans])
        out.append(_DIGITS.sub(lambda _, d=drawn: str(next(d)), examples[i % len(examples)]))
    return out


def mix_in(
    streams: list[Stream], examples: dict[str, list[str]], normalizer: Normalizer, seed: int
) -> tuple[list[Stream], int]:
    """The streams with lines like the feedback examples (`variants`, masked) inserted at
    seeded random places (they occur amid ordinary traffic, so that is the context to learn
    them in); how many lines were inserted.

    The templates share FEEDBACK_SHARE of the lines' worth, each at least FEEDBACK_REPEATS:
    a few verdicts must weigh against thousands of lines, and training caps the loss of each
    batch's most surprising lines (`robust_share`), which a rare example would always be."""
    if not examples:
        return streams, 0
    rng = random.Random(seed)
    total = sum(len(s.lines) for s in streams)
    count = max(FEEDBACK_REPEATS, math.ceil(FEEDBACK_SHARE * total / len(examples)))
    fed = [
        line
        for lines in examples.values()
        for line in variants([normalizer.mask(x) for x in lines], count, rng)
    ]
    if not total:
        return [*streams, Stream("feedback:normal", fed)], len(fed)
    lines = [list(s.lines) for s in streams]
    weights = [len(s.lines) for s in streams]
    for line in fed:
        target = rng.choices(range(len(streams)), weights)[0]
        lines[target].insert(rng.randrange(len(lines[target]) + 1), line)
    return [Stream(s.name, ls, s.ended) for s, ls in zip(streams, lines, strict=True)], len(fed)


def data_window(streams: list[Stream]) -> dict[str, float] | None:
    """First and last event time among the lines that carry a timestamp."""
    times = [t for s in streams for line in s.lines if (t := line_time(line)) is not None]
    return {"first": min(times), "last": max(times)} if times else None


def continue_training(
    model_dir: Path,
    new: list[Stream],
    config: TrainConfig,
    *,
    feedback_db: Path | None = None,
    progress: Any = None,
) -> tuple[Trained, list[Stream]]:
    """(the continued model, the streams it trained on: what its own sample is drawn from)."""
    model, tokenizer, meta = load_model_dir(model_dir)
    parent = model_id(model_dir)
    examples = feedback_examples(feedback_db) if feedback_db is not None else {}
    mixed, fed = mix_in(new, examples, Normalizer.from_json(meta["mask_rules"]), config.seed)
    replayed = read_sample(model_dir)
    streams = [*mixed, *replayed]
    trained = train(streams, config, progress=progress, start_from=Trained(model, tokenizer, meta))
    trained.meta.update(
        parent=parent,
        data_window=data_window(new),
        new_lines=sum(len(s.lines) for s in new),
        feedback_examples=sum(map(len, examples.values())),
        feedback_lines=fed,
        replayed_lines=sum(len(s.lines) for s in replayed),
    )
    return trained, streams


def refresh_prompt(model_dir: Path, new: list[Stream], config: TrainConfig) -> Trained:
    """`model_dir`'s weights with the pattern prompt rebuilt from `new`'s most common
    templates (within the same sink budget) and calibrated again on `new`'s held-out lines
    with the model's own scoring config: the sinks change what every line is scored
    against, so the old tails no longer hold. The model knows the old and new templates;
    its sources' rhythms (the quiet watch's baseline) are `new`'s."""
    model, tokenizer, meta = load_model_dir(model_dir)
    streams, heldout = heldout_split([s for s in new if s.lines], config)
    normalizer = Normalizer.from_json(meta["mask_rules"])
    masked = [normalizer.mask(line) for s in streams for line in s.lines]
    baseline = [*masked, *(normalizer.mask(line) for s in heldout for line in s.lines)]
    known = mine([*meta["templates"], *baseline]).templates()[:MAX_TEMPLATES]
    meta = {
        **meta,
        "pattern_prompt": pattern_prompt(mine(masked).templates(), config.prompt_templates),
        "templates": [t.text for t in known],
        "template_counts": [t.count for t in known],
        "parent": model_id(model_dir),
        "prompt_refreshed": True,
        "data_sha256": data_sha256(new),  # the data this version's prompt and tails come from
        "data_window": data_window(new),
        "new_lines": len(masked),
        "feedback_lines": 0,
        "replayed_lines": 0,
        "heldout_lines": len(baseline) - len(masked),
        "quiet_baseline": {source: r.to_json() for source, r in learn_baseline(new).items()},
    }
    detector = Detector(model, tokenizer, meta, device="cpu")
    scoring = Calibration.from_json(meta["calibration"]).config
    meta["calibration"] = calibrate(detector, heldout, scoring, streams).to_json()
    return Trained(model, tokenizer, meta)
