"""`logstream train`: fit tokenizer, pattern prompt and model on baseline logs; calibrate.

A training sequence is the pattern prompt (the sinks) followed by up to L tokens
of consecutive whole lines of one stream, so positions [0, S + L) are the same
in training and in serving. The loss is on log tokens only.

Baselines may contain incidents. After warm-up, each batch caps the loss of the
share `robust_share` of its lines with the highest loss (see
`robust_token_weights`), so a rare incident is not memorized: it stays surprising.
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from logstream.detector import Detector
from logstream.model import PRESETS, build_model, save_model_dir
from logstream.normalize import Normalizer
from logstream.patterns import mine, pattern_prompt
from logstream.records import LogRecord
from logstream.scoring import DEFAULT_LINE_TOP_K, Calibration, session_score
from logstream.tokenizer import LineTokenizer, prompt_ids, train_tokenizer


@dataclass(frozen=True)
class Stream:
    """One stream's lines in order; `ended` if it closed (a session), so its end is learned."""

    name: str
    lines: list[str]
    ended: bool = False


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "small"
    window: int = 2048  # L: ring slots per stream
    seed: int = 0
    epochs: float = 2.0
    max_steps: int = 2000
    batch_size: int = 8
    lr: float = 3e-3
    warmup_fraction: float = 0.1
    robust_share: float = 0.05  # share of each batch's lines whose loss is capped after warm-up
    heldout_fraction: float = 0.1
    prompt_templates: int = 16
    sink_tokens: int = 256  # cap on S
    line_top_k: int = DEFAULT_LINE_TOP_K  # line score: mean of the k most surprising tokens, 0 = all
    line_quantile: float = 0.995
    session_quantile: float = 0.999


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


def make_examples(
    streams: list[Stream], tokenizer: LineTokenizer, normalizer: Normalizer, window: int
) -> list[tuple[list[int], list[int]]]:
    """(token ids, line index per token) windows of whole lines, at most `window` tokens each."""
    examples = []
    for stream in streams:
        lines = tokenizer.encode_lines([normalizer.mask(line) for line in stream.lines])
        if stream.ended:
            lines.append([tokenizer.eos_id])  # the end of the stream is a "line" to predict
        ids: list[int] = []
        line_of: list[int] = []
        for i, line_ids in enumerate(lines):
            if ids and len(ids) + len(line_ids) > window:
                examples.append((ids, line_of))
                ids, line_of = [], []
            ids.extend(line_ids[:window])
            line_of.extend([i] * min(len(line_ids), window))
        if ids:
            examples.append((ids, line_of))
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


def fit(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    sink_ids: list[int],
    config: TrainConfig,
    progress: Callable[[int, int, float], None] | None = None,
) -> float:
    """Train in place; returns the last smoothed loss. Sinks are input only (no loss)."""
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    steps = min(config.max_steps, max(1, math.ceil(config.epochs * len(examples) / config.batch_size)))
    warmup = max(1, int(steps * config.warmup_fraction))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    S = len(sink_ids)
    order: list[int] = []
    smoothed = float("nan")
    model.train()
    for step in range(steps):
        if len(order) < config.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        batch = [examples[order.pop()] for _ in range(min(config.batch_size, len(examples)))]
        T = max(len(ids) for ids, _ in batch)
        tokens = torch.zeros(len(batch), S + T, dtype=torch.long)
        line_ids = torch.zeros(len(batch), T, dtype=torch.long)
        mask = torch.zeros(len(batch), T, dtype=torch.bool)
        for b, (ids, lines) in enumerate(batch):
            tokens[b, :S] = torch.tensor(sink_ids)
            tokens[b, S : S + len(ids)] = torch.tensor(ids)
            line_ids[b, : len(ids)] = torch.tensor(lines)
            mask[b, : len(ids)] = True
        logits = model(tokens).logits[:, S - 1 : S - 1 + T]  # predicts tokens[S : S+T]  [B, T, V]
        token_loss = F.cross_entropy(
            logits.float().transpose(1, 2), tokens[:, S:], reduction="none"
        )  # [B, T]
        share = config.robust_share if step >= warmup else 0.0
        weights = robust_token_weights(token_loss, line_ids, mask, share)
        loss = (token_loss * weights).sum() / weights.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        smoothed = loss.item() if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * loss.item()
        if progress:
            progress(step + 1, steps, smoothed)
    model.eval()
    return smoothed


def calibrate(detector: Detector, heldout: list[Stream], calibration: Calibration) -> Calibration:
    """Fit `calibration`'s thresholds to the detector's scores of held-out baseline streams.

    Thresholds are high quantiles of those scores; no labels are involved. The detector's
    own line score (top_k, level prior) is set from `calibration` first.
    """
    detector.calibration = calibration
    line_scores: list[float] = []
    end_scores: list[float] = []
    session_scores: list[float] = []
    group = detector.engine.max_streams  # streams scored together in one batch
    for start in range(0, len(heldout), group):
        streams = heldout[start : start + group]
        scored = detector.score([LogRecord(line=line, stream=s.name) for s in streams for line in s.lines])
        by_stream: dict[str, list[float]] = {s.name: [] for s in streams}
        for line in scored:
            by_stream[line.record.stream].append(line.score)
        for stream in streams:
            scores = by_stream[stream.name]
            line_scores += scores
            if stream.ended:
                end = detector.engine.end_nll(stream.name, detector.tokenizer.eos_id)
                end_scores.append(end)
                session_scores.append(session_score(scores, end))
            detector.engine.drop(stream.name)
    calibration.fit(line_scores, end_scores, session_scores)
    return calibration


def train(
    streams: list[Stream],
    config: TrainConfig,
    progress: Callable[[int, int, float], None] | None = None,
    start_from: Trained | None = None,
) -> Trained:
    """Fit a detector on baseline streams. `start_from` continues an earlier model (prequential)."""
    if config.preset not in PRESETS:
        raise ValueError(f"preset: unknown {config.preset!r}; expected one of {sorted(PRESETS)}")
    train_streams, heldout = split_heldout([s for s in streams if s.lines], config.heldout_fraction)
    if not any(s.lines for s in train_streams) or not any(s.lines for s in heldout):
        raise ValueError("training data: too few lines to train and hold out a calibration set")
    started = time.time()
    if start_from is None:
        normalizer = Normalizer()
        masked = [normalizer.mask(line) for s in train_streams for line in s.lines]
        tokenizer = train_tokenizer(masked, PRESETS[config.preset].vocab_size)
        tokenizer = LineTokenizer(tokenizer)
        prompt = pattern_prompt(mine(masked).templates(), config.prompt_templates)
        sink_ids = prompt_ids(tokenizer, prompt, config.sink_tokens)
        torch.manual_seed(config.seed)  # the initial weights too: --seed makes a run reproducible
        model = build_model(config.preset, tokenizer, max_positions=len(sink_ids) + config.window)
    else:
        # a copy: the earlier model keeps scoring its own chunk (prequential replay)
        model, tokenizer = copy.deepcopy(start_from.model), start_from.tokenizer
        normalizer = Normalizer.from_json(start_from.meta["mask_rules"])
        prompt = start_from.meta["pattern_prompt"]
        sink_ids = prompt_ids(tokenizer, prompt, config.sink_tokens)
    examples = make_examples(train_streams, tokenizer, normalizer, config.window)
    loss = fit(model, examples, sink_ids, config, progress)
    meta = {
        "preset": config.preset,
        "window": config.window,
        "sink_tokens": config.sink_tokens,
        "data_sha256": data_sha256(streams),
        "mask_rules": normalizer.to_json(),
        "pattern_prompt": prompt,
        "train_config": asdict(config),
        "train_lines": sum(len(s.lines) for s in train_streams),
        "train_tokens": sum(len(ids) for ids, _ in examples),
        "final_loss": loss,
        "train_seconds": round(time.time() - started, 1),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    calibration = Calibration(
        line_top_k=config.line_top_k,
        line_quantile=config.line_quantile,
        session_quantile=config.session_quantile,
    )
    detector = Detector(model, tokenizer, {**meta, "calibration": calibration.to_json()}, device="cpu")
    meta["calibration"] = calibrate(detector, heldout, calibration).to_json()
    return Trained(model, tokenizer, meta)


def save(trained: Trained, out: Path) -> None:
    save_model_dir(out, trained.model, trained.tokenizer, trained.meta)
