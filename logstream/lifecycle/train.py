"""`logstream train`: fit tokenizer, pattern prompt and model on baseline logs; calibrate.

A training sequence is the pattern prompt (the sinks) followed by up to L tokens
of consecutive whole lines of one stream, so positions [0, S + L) are the same
in training and in serving. The loss is on log tokens only.

Baselines may contain incidents. After warm-up, each batch caps the loss of the
share `robust_share` of its lines with the highest loss (see
`robust_token_weights`), so a rare incident is not memorized: it stays surprising.
Calibration is robust too: the tail fit drops held-out peaks that are implausible
for the normal lines' tail (`tail.fit_tail`).

The schedule adapts to the data, so a 1,000-line baseline trains as well as a
million-line one: the window shrinks to what the baseline can fill many times over
(`plan_window`, unless a window is asked for), the preset follows the baseline's size
(`choose_preset`), and training stops when the loss on validation windows (a share of
the training windows the optimizer never sees) has not improved for `patience`
evaluations, keeping the best weights (`fit`): a large baseline trains for as long as it
keeps teaching, a small one stops before it memorizes, within [`min_steps`, `max_steps`].
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from logstream.detector import Detector
from logstream.engine.model import PRESETS, build_model, save_model_dir
from logstream.engine.tokenizer import LineTokenizer, prompt_ids, train_tokenizer
from logstream.errors import UserError
from logstream.records import Stream
from logstream.scoring.bursts import HORIZON
from logstream.scoring.calibration import Calibration, HeldOut, fit_heldout
from logstream.scoring.config import ScoringConfig
from logstream.scoring.gpd import MIN_SAMPLES
from logstream.scoring.quiet import learn_baseline
from logstream.text.normalize import Normalizer
from logstream.text.patterns import MAX_TEMPLATES, mine, pattern_prompt

MIN_WINDOW = 64
AUTO_SMALL_LINES = 50_000  # preset "auto": tiny below this many baseline lines, small from it
MIN_HELDOUT_LINES = 300  # small baselines hold out more (up to 30%), so the tail fit has data
# ... and baselines of few sessions hold out enough of them for the end and session tails
MIN_HELDOUT_SESSIONS = 2 * MIN_SAMPLES
WINDOWS_PER_BASELINE = 64  # the window shrinks until the baseline holds this many of them


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "auto"  # "auto": by baseline size (`choose_preset`), or one of model.PRESETS
    window: int = 2048  # L: ring slots per stream (at most, with fit_window)
    fit_window: bool = True  # shrink the window to what the baseline fills (`plan_window`)
    seed: int = 0
    min_steps: int = 100  # a floor: validation loss is noisy at the start
    max_steps: int = 2000  # the budget, whatever the validation loss does
    eval_every: int = 50  # steps between validation losses
    patience: int = 4  # evaluations without improvement before training stops
    batch_size: int = 8
    lr: float = 3e-3
    warmup_fraction: float = 0.1
    robust_share: float = 0.05  # share of each batch's lines whose loss is capped after warm-up
    heldout_fraction: float = 0.1
    prompt_templates: int = 16
    sink_tokens: int = 256  # cap on S
    merge_across_words: bool = False  # BPE merges may cross spaces: fewer tokens a line (tokenizer.py)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    stream_key: str | None = None  # the regex that named the baseline's streams; saved with the model


def plan_window(tokens: int, window: int) -> int:
    """The largest power-of-two window (at most `window`) that the baseline fills
    WINDOWS_PER_BASELINE times: a 20k-token log cannot teach positions up to 2048."""
    fitted = window
    while fitted > MIN_WINDOW and tokens < WINDOWS_PER_BASELINE * fitted:
        fitted //= 2
    return max(min(fitted, window), min(MIN_WINDOW, window))


def choose_preset(preset: str, lines: int) -> str:
    """`auto` picks tiny for baselines under AUTO_SMALL_LINES lines: a ~25k-token log cannot
    feed the small model's 0.9M parameters, and tiny trains ~5x faster on a CPU."""
    if preset != "auto":
        return preset
    return "tiny" if lines < AUTO_SMALL_LINES else "small"


def sink_budget(config: TrainConfig, window: int) -> int:
    """At most `sink_tokens`, and at most half the window: attention costs (S + L)^2."""
    return min(config.sink_tokens, max(1, window // 2))


VALIDATION_SHARE = 0.1  # of the training windows, at most MAX_VALIDATION of them
MAX_VALIDATION = 32


def split_validation(examples: list[Example], seed: int) -> tuple[list[Example], list[Example]]:
    """(train, validation): a seeded VALIDATION_SHARE of the windows (at most MAX_VALIDATION)
    for early stopping; none when there are fewer than 10 windows (no early stopping)."""
    if len(examples) < 10:
        return examples, []
    n = min(MAX_VALIDATION, max(1, round(len(examples) * VALIDATION_SHARE)))
    held = set(random.Random(seed).sample(range(len(examples)), n))
    return [e for i, e in enumerate(examples) if i not in held], [
        e for i, e in enumerate(examples) if i in held
    ]


@dataclass
class Trained:
    model: torch.nn.Module
    tokenizer: LineTokenizer
    meta: dict[str, Any]


def data_sha256(streams: list[Stream]) -> str:
    digest = hashlib.sha256()
    for stream in streams:
        for line in stream.lines:
            digest.update(line.encode("utf-8", "replace") + b"\n")
    return digest.hexdigest()


def split_heldout(streams: list[Stream], fraction: float) -> tuple[list[Stream], list[Stream]]:
    """Hold out the last streams (many streams) or each stream's tail (few streams)."""
    if len(streams) >= 20:
        n = max(1, int(len(streams) * fraction))
        return streams[:-n], streams[-n:]
    train, heldout = [], []
    for s in streams:
        cut = len(s.lines) - max(1, int(len(s.lines) * fraction))
        train.append(Stream(s.name, s.lines[:cut], ended=False))
        heldout.append(Stream(f"{s.name}#heldout", s.lines[cut:], ended=s.ended))
    return train, heldout


def lines_before(train: list[Stream], heldout: list[Stream]) -> list[list[str]]:
    """Per held-out stream, the lines its bursts count after (`bursts`). A held-out stream
    counts from its own first line, as a scored stream does, so it has burst evidence once it
    has written a horizon; a held-out tail too short for that (a baseline of many hosts, each
    holding out a few dozen lines) would have none, and counts after the last HORIZON lines
    its stream wrote in training instead."""
    tails = {f"{s.name}#heldout": s.lines[-HORIZON:] for s in train}
    return [tails.get(s.name, []) if len(s.lines) < HORIZON else [] for s in heldout]


def heldout_split(streams: list[Stream], config: TrainConfig) -> tuple[list[Stream], list[Stream]]:
    """(train, held-out) as `train` splits them: `heldout_fraction`, but at least
    MIN_HELDOUT_LINES lines and MIN_HELDOUT_SESSIONS sessions (up to 30%) for small baselines."""
    total = sum(len(s.lines) for s in streams)
    sessions = sum(s.ended for s in streams)
    wanted = max(MIN_HELDOUT_LINES / max(total, 1), MIN_HELDOUT_SESSIONS / sessions if sessions else 0.0)
    return split_heldout(streams, max(config.heldout_fraction, min(0.3, wanted)))


Example = tuple[list[int], list[int], list[float]]  # token ids, line index per token, weight per token


def mask_streams(streams: list[Stream], normalizer: Normalizer) -> list[list[str]]:
    """Per stream, its lines as the normalizer masks them: what the tokenizer, the examples and
    the template miner of training read."""
    return [[normalizer.mask(line) for line in stream.lines] for stream in streams]


def make_examples(
    streams: list[Stream],
    encoded: list[list[list[int]]],
    eos_id: int,
    window: int,
    line_weights: list[list[float]] | None = None,
) -> list[Example]:
    """(token ids, line index per token, loss weight per token) windows of whole lines, at
    most `window` tokens each. `encoded`: per stream, its masked lines' token ids
    (`LineTokenizer.encode_lines`); `line_weights`: per stream, per line (default 1)."""
    examples = []
    for k, stream in enumerate(streams):
        lines = list(encoded[k])
        weights = line_weights[k] if line_weights is not None else [1.0] * len(lines)
        if stream.ended:
            lines.append([eos_id])  # the end of the stream is a "line" to predict
            weights = [*weights, 1.0]
        ids: list[int] = []
        line_of: list[int] = []
        weight: list[float] = []
        for i, line_ids in enumerate(lines):
            if ids and len(ids) + len(line_ids) > window:
                examples.append((ids, line_of, weight))
                ids, line_of, weight = [], [], []
            n = min(len(line_ids), window)
            ids.extend(line_ids[:window])
            line_of.extend([i] * n)
            weight.extend([weights[i]] * n)
        if ids:
            examples.append((ids, line_of, weight))
    return examples


def robust_token_weights(
    token_loss: torch.Tensor, line_ids: torch.Tensor, mask: torch.Tensor, share: float
) -> torch.Tensor:
    """Down-weight the batch's highest-loss lines. All tensors [B, T].

    Lines whose mean loss is above the batch's (1 - share) quantile tau get weight
    tau / loss: their gradient is capped like a truncated loss. A one-off incident
    thus barely moves the model, while a rare but *recurring* normal line is still
    learned, slowly, because it comes back in batch after batch (dropping such lines
    outright left rare normal lines unlearned and made them false alarms).
    """
    B = token_loss.shape[0]
    key = (torch.arange(B)[:, None] * (int(line_ids.max()) + 1) + line_ids)[mask]  # batch-global line id
    n_lines = int(key.max()) + 1
    line_loss = torch.zeros(n_lines).index_add_(0, key, token_loss[mask].detach())
    line_len = torch.zeros(n_lines).index_add_(0, key, torch.ones_like(key, dtype=torch.float))
    present = line_len > 0
    mean = line_loss / line_len.clamp(min=1)  # [n_lines]
    weights = mask.float()
    if share > 0 and present.sum() > 1:
        tau = torch.quantile(mean[present], 1.0 - share)
        line_weight = torch.where(mean > tau, tau / mean.clamp(min=1e-6), torch.ones_like(mean))
        weights[mask] = line_weight[key]
    return weights


def _batch(batch: list[Example], sink_ids: list[int]) -> tuple[torch.Tensor, ...]:
    """(tokens [B, S+T], line index per token [B, T], mask [B, T], weight per token [B, T])."""
    S, T = len(sink_ids), max(len(ids) for ids, _, _ in batch)
    tokens = torch.zeros(len(batch), S + T, dtype=torch.long)
    line_ids = torch.zeros(len(batch), T, dtype=torch.long)
    mask = torch.zeros(len(batch), T, dtype=torch.bool)
    weight = torch.zeros(len(batch), T)
    for b, (ids, lines, w) in enumerate(batch):
        tokens[b, :S] = torch.tensor(sink_ids)
        tokens[b, S : S + len(ids)] = torch.tensor(ids)
        line_ids[b, : len(ids)] = torch.tensor(lines)
        mask[b, : len(ids)] = True
        weight[b, : len(ids)] = torch.tensor(w)
    return tokens, line_ids, mask, weight


def _token_loss(
    forward: Callable, tokens: torch.Tensor, S: int, autocast: torch.dtype | None
) -> torch.Tensor:
    """Each log token's loss [B, T]; the sinks are input only."""
    T = tokens.shape[1] - S
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = forward(tokens).logits[:, S - 1 : S - 1 + T]  # predicts tokens[S : S+T]  [B, T, V]
    return F.cross_entropy(logits.float().transpose(1, 2), tokens[:, S:], reduction="none")


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module, examples: list[Example], sink_ids: list[int], batch_size: int
) -> float:
    """Mean token loss (nats) of the validation windows."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        tokens, _, mask, _ = _batch(examples[start : start + batch_size], sink_ids)
        loss = _token_loss(model, tokens, len(sink_ids), None)
        total += float(loss[mask].sum())
        count += int(mask.sum())
    model.train()
    return total / max(count, 1)


@dataclass(frozen=True)
class Fitted:
    steps: int  # optimizer steps taken
    best_step: int  # the step whose weights were kept (the best validation loss)
    loss: float  # the last smoothed training loss, nats a token
    validation: float | None  # the best validation loss (None: too few windows to hold any out)


def fit(
    model: torch.nn.Module,
    examples: list[Example],
    sink_ids: list[int],
    config: TrainConfig,
    progress: Callable[[int, int, float], None] | None = None,
    *,
    compile: bool = False,
    autocast: torch.dtype | None = None,
) -> Fitted:
    """Train in place until the validation loss stops improving (see the module doc).

    Speed levers, off by default (benchmarks/train_speed.py measures them): `compile` runs the
    forward and backward through torch.compile (the same math, reordered rounding);
    `autocast` (e.g. torch.bfloat16) runs the matmuls in that dtype with fp32 weights.
    """
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    examples, validation = split_validation(examples, config.seed)
    max_steps = max(config.max_steps, 1)
    min_steps = min(config.min_steps, max_steps)
    warmup = max(1, min(config.eval_every, max_steps // 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    S = len(sink_ids)
    order: list[int] = []
    smoothed = float("nan")
    best, best_step, best_state, waited = math.inf, 0, None, 0
    model.train()
    forward = torch.compile(model, dynamic=True) if compile else model
    step = 0
    while step < max_steps:
        if len(order) < config.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        batch = [examples[order.pop()] for _ in range(min(config.batch_size, len(examples)))]
        tokens, line_ids, mask, example_weight = _batch(batch, sink_ids)
        token_loss = _token_loss(forward, tokens, S, autocast)  # [B, T]
        share = config.robust_share if step >= warmup else 0.0
        weights = robust_token_weights(token_loss, line_ids, mask, share) * example_weight
        loss = (token_loss * weights).sum() / weights.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        smoothed = loss.item() if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * loss.item()
        if progress:
            progress(step, max_steps, smoothed)
        if validation and step % config.eval_every == 0:
            value = validation_loss(model, validation, sink_ids, config.batch_size)
            if value < best * (1 - 1e-3):
                best, best_step, waited = value, step, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                waited += 1
            if waited >= config.patience and step >= min_steps:
                break
    if best_state is not None and waited:  # the last evaluations did not improve: back to the best
        model.load_state_dict(best_state)
    else:  # still improving at the budget's end (or never evaluated): the last weights
        best_step = step
    model.eval()
    return Fitted(step, best_step, smoothed, best if best_state is not None else None)


def calibrate(
    detector: Detector, heldout: list[Stream], config: ScoringConfig, train: list[Stream]
) -> Calibration:
    """Fit the detector's calibration to what it observes on held-out baseline streams
    (`calibration.fit_heldout`), each after the lines its stream wrote in `train`
    (`lines_before`). No labels are involved."""
    detector.reset()
    detector.calibration = Calibration(config=config)  # no tails yet: observations only
    before = [
        detector.scorer.templates(map(detector.normalizer.mask, lines))
        for lines in lines_before(train, heldout)
    ]
    streams = []
    group = detector.engine.max_streams  # streams scored together in one batch
    for start in range(0, len(heldout), group):
        batch = detector.score_streams(heldout[start : start + group], ends=True)
        for session, templates_before in zip(batch, before[start : start + group], strict=True):
            lines = session.lines
            streams.append(
                HeldOut(
                    [s.surprisal for s in lines],
                    [s.template_id for s in lines],
                    [s.level for s in lines],
                    session.end.surprisal if session.end is not None else None,
                    templates_before,
                )
            )
    detector.calibration = calibration = fit_heldout(config, streams)
    detector.reset()  # the held-out lines taught the miner nothing that scoring should keep
    return calibration


def train(
    streams: list[Stream],
    config: TrainConfig,
    progress: Callable[[int, int, float], None] | None = None,
    start_from: Trained | None = None,
) -> Trained:
    """Fit a detector on baseline streams. `start_from` continues an earlier model (prequential)."""
    if config.preset != "auto" and config.preset not in PRESETS:
        raise ValueError(f"preset: unknown {config.preset!r}; expected auto or one of {sorted(PRESETS)}")
    streams = [s for s in streams if s.lines]
    total = sum(len(s.lines) for s in streams)
    train_streams, heldout = heldout_split(streams, config)
    if not any(s.lines for s in train_streams) or not any(s.lines for s in heldout):
        raise UserError("training data: too few lines to train and hold out a calibration set")
    started = time.time()
    normalizer = Normalizer() if start_from is None else Normalizer.from_json(start_from.meta["mask_rules"])
    masked_streams = mask_streams(train_streams, normalizer)
    masked = [line for stream in masked_streams for line in stream]
    # the templates the model knows: those of the whole baseline, held-out lines too (a
    # held-out line is not new to the system, and its lines count for the rarity)
    baseline = [*masked, *(normalizer.mask(line) for s in heldout for line in s.lines)]
    if start_from is None:
        preset = choose_preset(config.preset, total)
        tokenizer = LineTokenizer(
            train_tokenizer(masked, PRESETS[preset].vocab_size, config.merge_across_words)
        )
        miner = mine(masked)
        prompt = pattern_prompt(miner.templates(), config.prompt_templates)
        tokens = sum(map(len, tokenizer.encode_lines(masked)))
        window = plan_window(tokens, config.window) if config.fit_window else config.window
        sink_ids = prompt_ids(tokenizer, prompt, sink_budget(config, window))
        torch.manual_seed(config.seed)  # the initial weights too: --seed makes a run reproducible
        model = build_model(preset, tokenizer, max_positions=len(sink_ids) + window)
        known = mine(baseline).templates()
    else:
        # a copy: the earlier model keeps scoring its own chunk (prequential replay)
        model, tokenizer = copy.deepcopy(start_from.model), start_from.tokenizer
        prompt, window = start_from.meta["pattern_prompt"], start_from.meta["window"]
        preset = start_from.meta["preset"]
        sink_ids = prompt_ids(tokenizer, prompt, start_from.meta["sink_tokens"])
        known = mine([*start_from.meta["templates"], *baseline]).templates()
    encoded = [tokenizer.encode_lines(stream) for stream in masked_streams]
    examples = make_examples(train_streams, encoded, tokenizer.eos_id, window)
    fitted = fit(model, examples, sink_ids, config, progress)
    meta = {
        "preset": preset,
        "window": window,
        "sink_tokens": len(sink_ids),
        "data_sha256": data_sha256(streams),
        "mask_rules": normalizer.to_json(),
        "pattern_prompt": prompt,
        "templates": [t.text for t in known[:MAX_TEMPLATES]],
        # lines per template: the rarity evidence starts from them (a known one counts once)
        "template_counts": [t.count for t in known[:MAX_TEMPLATES]],
        "train_config": asdict(config),
        "train_lines": len(masked),
        "heldout_lines": sum(len(s.lines) for s in heldout),
        "train_tokens": sum(len(ids) for ids, _, _ in examples),
        "train_steps": fitted.steps,
        "train_best_step": fitted.best_step,
        "train_epochs": round(fitted.steps * config.batch_size / max(len(examples), 1), 2),
        "final_loss": fitted.loss,
        "validation_loss": fitted.validation,
        "train_seconds": round(time.time() - started, 1),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stream_key": config.stream_key,  # replay and tail default to it
        "calibration": Calibration(config=config.scoring).to_json(),
        # each source's rhythm (held-out lines too): quiet watches start from it (logstream.scoring.quiet)
        "quiet_baseline": {source: r.to_json() for source, r in learn_baseline(streams).items()},
    }
    detector = Detector(model, tokenizer, meta, device="cpu")
    meta["calibration"] = calibrate(detector, heldout, config.scoring, train_streams).to_json()
    return Trained(model, tokenizer, meta)


def save(trained: Trained, out: Path) -> None:
    save_model_dir(out, trained.model, trained.tokenizer, trained.meta)
