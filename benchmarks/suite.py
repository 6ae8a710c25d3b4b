"""The project's speed and memory claims as numbers, side by side in one run (docs/benchmarks.md).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/suite.py [--quick] [--only table] [--json]
        [--stream-lines 200000] [--threads 1] [--runs runs/bench] [--plots docs]

It lives in benchmarks/, not in the package: peer detectors, memory probes and plots are no
part of scoring. `benchmarks/streaming.py` runs it with the sizes docs/benchmarks.md uses.

Sections (each a function returning a JSON-able dict):
- table:     the StreamingLLM table on one long log stream: dense attention with recompute,
             a sliding window without sinks, a sliding window with recompute, and sinks + ring
             (ours); ms/line, peak memory, perplexity and AUC-PR at several stream lengths.
- constant:  per-line latency p50/p99, RSS and cache bytes along one very long stream.
- streams:   lines/s and memory with 1 .. 1024 streams batched in one engine.
- ablation:  sinks S = 0, 1 (BOS), 4 and the pattern prompt, with a small window so the
             window rolls after a line or two: perplexity, AUC-PR, the score around the roll.
- peers:     Drain3 rare/new-template detectors (fitted, and mining online), a DeepLog-style
             next-template n-gram model and a DeepLog LSTM over template ids, against ours at the
             tiny and small presets, on HDFS sessions (the 80/20 split of
             benchmarks/quality.py) and on the synthetic incidents of `logstream demo`:
             F1, AUC-PR, lines/s on the same lines and machine.

Models are trained in-process with few steps (tiny preset) and cached under `runs/`, keyed by
the training config and data, so reruns skip training. Costs are measured on token ids
(masking and tokenization, the same for every method, are left out) with one line per call,
as in serving. Memory is the process's resident set sampled every few milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import itertools
import json
import math
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
import torch.nn.functional as F

from logstream.consumers.inputs import (
    InputStats,
    parse_lines,
    read_sessions,
    streams_from_lines,
    streams_from_records,
    streams_from_sessions,
)
from logstream.detector import Detector
from logstream.engine.model import load_model_dir
from logstream.engine.streaming import StreamingEngine
from logstream.engine.tokenizer import prompt_ids
from logstream.evaluation.metrics import auc_pr, best_f1, precision_recall_f1
from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines
from logstream.lifecycle.train import Stream, TrainConfig, Trained, data_sha256, save, split_heldout, train
from logstream.replay import ReplayInput, ReplayOptions, run_replay
from logstream.scoring.calibration import Calibration, session_worst
from logstream.scoring.evidence import line_surprisal
from logstream.text.normalize import Normalizer
from logstream.text.patterns import PatternMiner

log = structlog.get_logger(__name__)

SECTIONS = ("table", "constant", "streams", "ablation", "peers")
HDFS_SESSIONS = Path("../shared/data/hdfs/train_sessions.jsonl")
MiB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. FULL is the documented run; QUICK is the CI smoke run."""

    lengths: tuple[int, ...] = (1_000, 10_000, 100_000)  # table: stream lengths in lines
    eval_lines: int = 300  # table: lines scored (and timed) at each length
    dense_max_tokens: int = 40_000  # table: dense recompute beyond this history is capped
    stream_lines: int = 100_000  # constant: length of the stream (docs: also a 1M-line run)
    checkpoints: int = 20  # constant: latency samples along the stream
    samples: int = 200  # constant: single-line calls per checkpoint
    stream_counts: tuple[int, ...] = (1, 16, 256, 1024)
    ablation_streams: int = 32
    ablation_lines: int = 300
    ablation_window: int = 64  # ~3 lines: the window rolls from about the third line on
    hdfs_sessions: int | None = None  # None = all; QUICK takes the first N (same 80/20 cut)
    window: int = 128  # L of the synthetic model
    hdfs_window: int = 256  # L of the HDFS model (a session is ~20 lines of ~15 tokens)
    max_steps: int = 300
    threads: int = 1


FULL = BenchConfig()
QUICK = BenchConfig(
    lengths=(200, 1_000), eval_lines=60, stream_lines=3_000, checkpoints=5, samples=30,
    stream_counts=(1, 16, 64), ablation_streams=8, ablation_lines=80, hdfs_sessions=600,
    window=64, hdfs_window=128, max_steps=40,
)  # fmt: skip


# -- measuring ----------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except OSError:
        return 0


PAGE_SIZE = 4096


def _release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc), so an earlier method's peak hides no later one."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakRSS:
    """Context manager: the peak RSS growth over the entry value, sampled every 2 ms."""

    def __init__(self) -> None:
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        _release_free_memory()
        self.base = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mib(self) -> float:
        return round((self.peak - self.base) / MiB, 1)


def percentile_ms(seconds: list[float], q: float) -> float:
    return round(float(np.percentile(seconds, q)) * 1000, 3)


# -- data and models ------------------------------------------------------------------------------


@dataclass
class Encoded:
    """Lines of one stream, their token ids, which tokens begin a word, and labels (1 = incident)."""

    lines: list[str]
    ids: list[list[int]]
    words: list[np.ndarray]
    labels: list[int]


def encode(trained: Trained, lines: list[str], labels: list[int] | None = None) -> Encoded:
    normalizer = Normalizer.from_json(trained.meta["mask_rules"])
    ids = trained.tokenizer.encode_lines([normalizer.mask(line) for line in lines])
    words = [trained.tokenizer.word_starts(line_ids) for line_ids in ids]
    return Encoded(lines, ids, words, labels if labels is not None else [0] * len(lines))


def web_stream(n: int, seed: int, incidents_per_line: float = 0.0) -> tuple[list[str], list[int]]:
    """`n` lines of host web-0 of a system with one web host and one worker (one stream).

    Incidents of the kinds that land on web hosts (unseen status, burst) are spread over it.
    """
    total = int(n * 2.0) + 100  # web-0 gets ~57% of the lines
    kinds = ("unseen_value", "burst") * max(0, int(total * incidents_per_line / 2))
    generated = generate_lines(total, seed=seed, incidents=kinds, incident_start=0.0, web_hosts=1, workers=1)
    pairs = [
        (line, y) for line, y in zip(generated.lines, generated.labels, strict=True) if " web-0 " in line
    ]
    if len(pairs) < n:
        raise ValueError(f"web_stream: generated {len(pairs)} web lines, need {n}")
    return [p[0] for p in pairs[:n]], [p[1] for p in pairs[:n]]


def cached_train(runs: Path, name: str, streams: list[Stream], config: TrainConfig) -> Trained:
    """Train (or load the model trained before on the same data and config) under runs/bench/."""
    key = hashlib.sha256(json.dumps([asdict(config), data_sha256(streams)]).encode()).hexdigest()[:12]
    directory = runs / f"{name}-{key}"
    if (directory / "logstream.json").is_file():
        model, tokenizer, meta = load_model_dir(directory)
        log.info("bench.model_cached", path=str(directory))
        return Trained(model, tokenizer, meta)
    started = time.perf_counter()
    trained = train(streams, config)
    save(trained, directory)
    log.info("bench.model_trained", path=str(directory), seconds=round(time.perf_counter() - started, 1))
    return trained


def synthetic_baseline() -> list[Stream]:
    """The baseline of `logstream demo`: 6000 incident-free lines, one stream per host."""
    return streams_from_lines(generate_lines(6000, seed=1).lines, STREAM_KEY)


def synthetic_model(config: BenchConfig, runs: Path, preset: str = "tiny") -> Trained:
    train_config = TrainConfig(
        preset=preset, window=config.window, fit_window=False, max_steps=config.max_steps
    )
    return cached_train(runs, f"synthetic-{preset}", synthetic_baseline(), train_config)


def calibration_of(trained: Trained) -> Calibration:
    """The calibration saved with the model (its top-k, priors, offsets), as the detector reads it."""
    return Calibration.from_json(trained.meta["calibration"])


def scores_of(calibration: Calibration, nlls: list[np.ndarray], data: Encoded) -> np.ndarray:
    """Line surprisal (`evidence.line_surprisal` with the model's top k) plus the level prior
    in nats' stead (its orders of magnitude): the benchmark compares models and caches, not
    tails. A line scored without its first token (nothing before it) loses that token's word
    start."""
    config = calibration.config
    out = []
    for nll, words, line in zip(nlls, data.words, data.lines, strict=True):
        if len(nll) < len(words):
            words = np.r_[True, words[len(words) - len(nll) + 1 :]]
        out.append(line_surprisal(nll, words, config.line_top_k) + config.prior(config.level(line)))
    return np.array(out)


def perplexity(nlls: list[np.ndarray], labels: list[int]) -> float:
    """exp(mean token NLL) over the normal lines."""
    normal = [nll for nll, y in zip(nlls, labels, strict=True) if y == 0]
    return round(float(np.exp(np.concatenate(normal).mean())), 3)


def quality(calibration: Calibration, nlls: list[np.ndarray], data: Encoded) -> dict[str, float]:
    labels = np.array(data.labels)
    ap = auc_pr(scores_of(calibration, nlls, data), labels) if labels.any() else float("nan")
    return {"perplexity": perplexity(nlls, data.labels), "auc_pr": round(ap, 4)}


def kv_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of keys and values for `tokens` positions (fp32): layers x 2 x T x kv_heads x head_dim x 4."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * tokens * c.num_key_value_heads * head_dim * 4


# -- 1. the StreamingLLM table ------------------------------------------------------------------


def _engine_method(
    trained: Trained, sinks: str, window: int, stream: Encoded, lengths: tuple[int, ...], eval_lines: int
) -> list[dict[str, Any]]:
    """Sinks + ring (sinks="patterns") or a window without sinks ("none"): feed the stream in bulk
    up to each length, then score `eval_lines` lines one call per line, timed."""
    rows, position = [], 0
    with PeakRSS() as peak:  # from before the engine exists: its ring is part of its memory
        detector = Detector(
            trained.model, trained.tokenizer, trained.meta, window=window, max_streams=1, device="cpu"
        )
        if sinks == "none":  # the ablation: the same model over a window without sinks
            detector.engine = StreamingEngine(trained.model, [], window=window, max_streams=1, device="cpu")
        engine = detector.engine
        for n in lengths:
            for start in range(position, n, 4096):
                engine.score({"s": stream.ids[start : min(n, start + 4096)]})
            segment = slice(n, n + eval_lines)
            nlls, seconds = [], []
            for ids in stream.ids[segment]:
                started = time.perf_counter()
                nlls.append(engine.score({"s": [ids]})["s"][0])
                seconds.append(time.perf_counter() - started)
            position = n + eval_lines
            sink_bytes = kv_bytes(trained.model, engine.sink_k[0].shape[1])
            rows.append({
                "lines": n, "status": "ok", "ms_per_line": percentile_ms(seconds, 50),
                "peak_rss_mib": peak.growth_mib, "kv_bytes": engine.cache_bytes + sink_bytes,
                **quality(detector.calibration, nlls, _part(stream, segment)),
            })  # fmt: skip
    return rows


def _part(stream: Encoded, part: slice) -> Encoded:
    return Encoded(stream.lines[part], stream.ids[part], stream.words[part], stream.labels[part])


def _line_nll(logits: torch.Tensor, targets: list[int]) -> np.ndarray:
    """NLL of `targets` given logits [T, V] of the positions just before each target."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
    return (-logprobs.gather(-1, torch.tensor(targets)[:, None])[:, 0]).numpy()


@torch.no_grad()
def _window_recompute(
    trained: Trained, window: int, stream: Encoded, n: int, eval_lines: int
) -> dict[str, Any]:
    """Each line: an HF forward over the last L tokens before it plus the line itself."""
    model = trained.model
    history = deque((t for ids in stream.ids[max(0, n - window) : n] for t in ids), maxlen=window)
    nlls, seconds = [], []
    with PeakRSS() as peak:
        for ids in stream.ids[n : n + eval_lines]:
            started = time.perf_counter()
            context = list(history)
            tokens = torch.tensor([context + ids])
            logits = model(tokens, logits_to_keep=len(ids) + 1).logits[0, :-1]
            # with no context, nothing predicts the stream's first token: score the rest
            nlls.append(_line_nll(logits, ids if context else ids[1:]))
            seconds.append(time.perf_counter() - started)
            history.extend(ids)
    return {
        "lines": n, "status": "ok", "ms_per_line": percentile_ms(seconds, 50), "peak_rss_mib": peak.growth_mib,
        "kv_bytes": kv_bytes(model, window + max(map(len, stream.ids[n : n + eval_lines]))),
        **quality(calibration_of(trained), nlls, _part(stream, slice(n, n + eval_lines))),
    }  # fmt: skip


@torch.no_grad()
def _dense(
    trained: Trained,
    sink_ids: list[int],
    stream: Encoded,
    n: int,
    eval_lines: int,
    max_tokens: int,
    timed_lines: int = 3,
) -> dict[str, Any]:
    """Dense attention over the whole history (pattern prompt first), recomputed for every line.

    With a causal mask, one forward over history + the scored lines gives each line exactly
    the NLL of its own recompute, so quality takes one forward; latency is timed on
    `timed_lines` real per-line recomputes. Beyond `max_tokens` the run is capped.
    """
    model = trained.model
    prefix = sink_ids + [t for ids in stream.ids[:n] for t in ids]
    segment = stream.ids[n : n + eval_lines]
    total = len(prefix) + sum(map(len, segment))
    if total > max_tokens:
        return {
            "lines": n,
            "status": f"capped: {total:,} tokens of history > {max_tokens:,}",
            "kv_bytes": kv_bytes(model, total),
        }
    seconds = []
    with PeakRSS() as peak:
        for j in range(timed_lines):
            history = prefix + [t for ids in segment[:j] for t in ids]
            started = time.perf_counter()
            tokens = torch.tensor([history + segment[j]])
            _line_nll(model(tokens, logits_to_keep=len(segment[j]) + 1).logits[0, :-1], segment[j])
            seconds.append(time.perf_counter() - started)
        flat = [t for ids in segment for t in ids]
        logits = model(torch.tensor([prefix + flat]), logits_to_keep=len(flat) + 1).logits[0, :-1]
    nll = _line_nll(logits, flat)
    bounds = np.cumsum([0] + [len(ids) for ids in segment])
    nlls = [nll[a:b] for a, b in itertools.pairwise(bounds)]
    return {
        "lines": n, "status": "ok", "ms_per_line": percentile_ms(seconds, 50), "peak_rss_mib": peak.growth_mib,
        "kv_bytes": kv_bytes(model, total),
        **quality(calibration_of(trained), nlls, _part(stream, slice(n, n + eval_lines))),
    }  # fmt: skip


def _extrapolate_dense(rows: list[dict[str, Any]], stream: Encoded, sink_count: int) -> None:
    """Capped dense rows get the per-line time a quadratic-in-history fit of the run ones predicts."""
    measured = [r for r in rows if r["status"] == "ok"]
    if not measured:
        return
    ref = measured[-1]
    ref_tokens = sink_count + sum(map(len, stream.ids[: ref["lines"]]))
    for row in rows:
        if row["status"] != "ok":
            tokens = sink_count + sum(map(len, stream.ids[: row["lines"]]))
            row["ms_per_line_estimated"] = round(ref["ms_per_line"] * (tokens / ref_tokens) ** 2, 1)


def table_section(trained: Trained, config: BenchConfig) -> dict[str, Any]:
    need = max(config.lengths) + config.eval_lines
    lines, labels = web_stream(need, seed=11, incidents_per_line=1 / 80)
    stream = encode(trained, lines, labels)
    sink_ids = prompt_ids(trained.tokenizer, trained.meta["pattern_prompt"], trained.meta["sink_tokens"])
    window = config.window
    methods: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    # smallest memory first: freed memory an allocator keeps would hide a later method's growth
    methods["sinks_ring"] = _engine_method(
        trained, "patterns", window, stream, config.lengths, config.eval_lines
    )
    methods["window_no_sinks"] = _engine_method(
        trained, "none", window, stream, config.lengths, config.eval_lines
    )
    methods["window_recompute"] = [
        _window_recompute(trained, window, stream, n, config.eval_lines) for n in config.lengths
    ]
    methods["dense_recompute"] = [
        _dense(trained, sink_ids, stream, n, config.eval_lines, config.dense_max_tokens)
        for n in config.lengths
    ]
    _extrapolate_dense(methods["dense_recompute"], stream, len(sink_ids))
    return {
        "stream": "host web-0 of a synthetic system (seed 11), incidents (unseen status, burst) ~1 per 80 lines",
        "window": window, "sinks": len(sink_ids), "eval_lines": config.eval_lines,
        "tokens_per_line": round(float(np.mean([len(i) for i in stream.ids])), 1),
        "trained_positions": len(sink_ids) + window, "methods": methods,
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


# -- 2. constant cost ------------------------------------------------------------------------------


def _stream_chunks(trained: Trained, total: int, chunk: int = 10_000) -> Iterator[list[list[int]]]:
    """Token ids of `total` web-0 lines, generated `chunk` lines at a time (bounded memory)."""
    for k, start in enumerate(range(0, total, chunk)):
        lines, _ = web_stream(min(chunk, total - start), seed=1000 + k)
        yield encode(trained, lines).ids


def constant_section(trained: Trained, config: BenchConfig) -> dict[str, Any]:
    detector = Detector(
        trained.model, trained.tokenizer, trained.meta, window=config.window, max_streams=1, device="cpu"
    )
    engine = detector.engine
    every = config.stream_lines // config.checkpoints
    points: list[dict[str, Any]] = []
    seen, next_checkpoint = 0, every - config.samples
    started = time.perf_counter()
    for ids in _stream_chunks(trained, config.stream_lines):
        i = 0
        while i < len(ids):
            if seen >= next_checkpoint:
                seconds = []
                for line in ids[i : i + config.samples]:
                    t0 = time.perf_counter()
                    engine.score({"s": [line]})
                    seconds.append(time.perf_counter() - t0)
                i, seen = i + len(seconds), seen + len(seconds)
                points.append({
                    "lines": seen, "p50_ms": percentile_ms(seconds, 50), "p99_ms": percentile_ms(seconds, 99),
                    "rss_mib": round(rss_bytes() / MiB, 1), "cache_bytes": engine.cache_bytes,
                })  # fmt: skip
                next_checkpoint += every
                continue
            block = ids[i : min(len(ids), i + next_checkpoint - seen, i + 2048)]
            engine.score({"s": block})
            i, seen = i + len(block), seen + len(block)
    steady = points[1:]  # the first checkpoint is the warm-up
    return {
        "stream_lines": seen, "window": config.window, "points": points,
        "p50_fluctuation": _fluctuation([p["p50_ms"] for p in steady]),
        "p50_drift": _drift([p["p50_ms"] for p in steady]),
        "rss_fluctuation": _fluctuation([p["rss_mib"] for p in steady]),
        "cache_bytes_constant": len({p["cache_bytes"] for p in points}) == 1,
        "bulk_lines_per_second": round(seen / (time.perf_counter() - started), 1),
    }  # fmt: skip


def _drift(values: list[float]) -> float:
    """Growth from the first to the second half of the stream: median(late) / median(early) - 1.

    Unlike the largest deviation, this is immune to a few checkpoints slowed by other processes."""
    half = len(values) // 2
    if half == 0:
        return float("nan")
    return round(float(np.median(values[half:]) / np.median(values[:half]) - 1), 4)


def _fluctuation(values: list[float]) -> float:
    """Largest relative distance from the median (0.03 = 3%)."""
    if not values:
        return float("nan")
    median = float(np.median(values))
    return round(max(abs(v - median) for v in values) / median, 4) if median else 0.0


# -- 3. many streams ---------------------------------------------------------------------------------


def streams_section(trained: Trained, config: BenchConfig) -> dict[str, Any]:
    pool, _ = web_stream(4096, seed=21)
    ids = encode(trained, pool).ids
    mean_tokens = float(np.mean([len(i) for i in ids]))
    warm_rounds = math.ceil(config.window / mean_tokens) + 1  # every ring full before timing
    rows = []
    for n in config.stream_counts:
        with PeakRSS() as peak:
            detector = Detector(
                trained.model,
                trained.tokenizer,
                trained.meta,
                window=config.window,
                max_streams=n,
                device="cpu",
            )
            engine = detector.engine
            rounds = max(3, min(50, 4096 // n))
            timed = 0.0
            for r in range(warm_rounds + rounds):
                batch = {f"s{k}": [ids[(k * 7 + r) % len(ids)]] for k in range(n)}
                started = time.perf_counter()
                engine.score(batch)
                if r >= warm_rounds:
                    timed += time.perf_counter() - started
        rows.append({
            "streams": n, "lines_per_second": round(n * rounds / timed, 1),
            "ms_per_round": round(timed / rounds * 1000, 2), "cache_bytes": engine.cache_bytes,
            "bytes_per_stream": engine.bytes_per_stream, "peak_rss_mib": peak.growth_mib,
        })  # fmt: skip
        del detector, engine
    return {"window": config.window, "rows": rows}


# -- 4. sink ablation ------------------------------------------------------------------------------------


def ablation_section(trained: Trained, config: BenchConfig) -> dict[str, Any]:
    window = config.ablation_window
    calibration = calibration_of(trained)
    prompt = prompt_ids(trained.tokenizer, trained.meta["pattern_prompt"], trained.meta["sink_tokens"])
    modes = {"S=0": [], "S=1 (BOS)": prompt[:1], "S=4": prompt[:4], f"patterns (S={len(prompt)})": prompt}
    streams = []
    for k in range(config.ablation_streams):
        lines, labels = web_stream(config.ablation_lines, seed=300 + k, incidents_per_line=1 / 60)
        streams.append(encode(trained, lines, labels))
    rolls = [int(np.searchsorted(np.cumsum([len(i) for i in s.ids]), window, side="right")) for s in streams]
    out: dict[str, Any] = {"window": window, "streams": len(streams), "lines_per_stream": config.ablation_lines,
                           "roll_line_median": int(np.median(rolls)), "modes": {}}  # fmt: skip
    for name, sink_ids in modes.items():
        engine = StreamingEngine(
            trained.model, sink_ids, window=window, max_streams=len(streams), device="cpu"
        )
        nll = engine.score({str(k): s.ids for k, s in enumerate(streams)})
        per_stream = [nll[str(k)] for k in range(len(streams))]
        everything = Encoded(
            [line for s in streams for line in s.lines], [i for s in streams for i in s.ids],
            [w for s in streams for w in s.words], [y for s in streams for y in s.labels],
        )  # fmt: skip
        result = quality(calibration, [n for p in per_stream for n in p], everything)
        scores = [scores_of(calibration, p, s) for p, s in zip(per_stream, streams, strict=True)]
        result |= {
            "score_before_roll": _mean_normal(scores, streams, lambda k: range(1, rolls[k])),
            "score_after_roll": _mean_normal(scores, streams, lambda k: range(rolls[k], rolls[k] + 5)),
            "score_steady": _mean_normal(
                scores, streams, lambda k: range(rolls[k] + 20, config.ablation_lines)
            ),
            "mean_score_by_line": [
                round(float(np.mean([s[i] for s in scores])), 3)
                for i in range(min(40, config.ablation_lines))
            ],
        }
        out["modes"][name] = result
    return out


def _mean_normal(scores: list[np.ndarray], streams: list[Encoded], index: Callable[[int], range]) -> float:
    """Mean score of the normal lines at the given line indices of each stream."""
    values = [
        scores[k][i]
        for k, s in enumerate(streams)
        for i in index(k)
        if i < len(s.labels) and s.labels[i] == 0
    ]
    return round(float(np.mean(values)), 3) if values else float("nan")


# -- 5. peers ---------------------------------------------------------------------------------------------


class TemplateDetector(ABC):
    """Base of the peers: Drain3 templates (on masked lines) fitted on baseline streams."""

    def __init__(self, streams: list[Stream], normalizer: Normalizer) -> None:
        self.normalizer = normalizer
        self.miner = PatternMiner()
        self.sequences = [
            [self.miner.add(normalizer.mask(line)).template_id for line in s.lines] for s in streams
        ]
        self.counts = Counter(t for seq in self.sequences for t in seq)
        self.total = sum(self.counts.values())

    def templates(self, lines: list[str]) -> list[int]:
        """Template ids of lines (-1 for a line no known template matches); learns nothing."""
        return [
            t if (t := self.miner.match(self.normalizer.mask(line))) is not None else -1 for line in lines
        ]

    @abstractmethod
    def score_stream(self, lines: list[str], ended: bool) -> tuple[list[float], float | None]:
        """Scores of the stream's lines, and of its end when `ended`."""


class DrainRarity(TemplateDetector):
    """A line is as anomalous as its template is rare in the baseline: -log p(template); new is rarest."""

    def score_stream(self, lines: list[str], ended: bool) -> tuple[list[float], float | None]:
        denominator = self.total + len(self.counts) + 1
        return [-math.log((self.counts.get(t, 0) + 1) / denominator) for t in self.templates(lines)], None


class NgramNext(TemplateDetector):
    """DeepLog-style next-template prediction, with counts instead of an LSTM: -log p(t | previous
    `order - 1` templates), interpolated over orders with fixed weights; a session's end is a
    template too."""

    START, END = -2, -3
    WEIGHTS = (0.6, 0.25, 0.1, 0.05)  # context of 2, 1, 0 templates, uniform

    def __init__(self, streams: list[Stream], normalizer: Normalizer) -> None:
        super().__init__(streams, normalizer)
        self.ngrams: Counter[tuple[int, ...]] = Counter()
        for seq, stream in zip(self.sequences, streams, strict=True):
            padded = [self.START, self.START, *seq, *([self.END] if stream.ended else [])]
            for i in range(2, len(padded)):
                for order in (1, 2, 3):
                    self.ngrams[tuple(padded[i - order + 1 : i + 1])] += 1
                    self.ngrams[(*padded[i - order + 1 : i], None)] += 1  # context count
        self.vocabulary = len(self.counts) + 2

    def _surprisal(self, context: tuple[int, int], t: int) -> float:
        p = self.WEIGHTS[3] / self.vocabulary
        for weight, order in zip(self.WEIGHTS[:3], (3, 2, 1), strict=True):
            ctx = context[2 - (order - 1) :]
            seen = self.ngrams.get((*ctx, None), 0)
            if seen:
                p += weight * self.ngrams.get((*ctx, t), 0) / seen
        return -math.log(p)

    def score_stream(self, lines: list[str], ended: bool) -> tuple[list[float], float | None]:
        context, scores = (self.START, self.START), []
        for t in self.templates(lines):
            scores.append(self._surprisal(context, t))
            context = (context[1], t)
        return scores, self._surprisal(context, self.END) if ended else None


class DrainOnline(TemplateDetector):
    """Drain3 online: every line is mined (`PatternMiner.add`, learning new templates as they come)
    and scores -log p(its template) from the counts so far, before it is counted itself."""

    def score_stream(self, lines: list[str], ended: bool) -> tuple[list[float], float | None]:
        scores = []
        for line in lines:
            t = self.miner.add(self.normalizer.mask(line)).template_id
            scores.append(-math.log((self.counts.get(t, 0) + 1) / (self.total + len(self.counts) + 1)))
            self.counts[t] += 1
            self.total += 1
        return scores, None


class DeepLogLSTM(TemplateDetector):
    """DeepLog (Du et al., 2017): an LSTM over the last HISTORY template ids predicts the next one
    (2 layers of 64, as in the paper); a line scores -log p(its template | history) instead of
    DeepLog's top-g membership, so AUC-PR has a ranking. A session's end is a template too; a
    template never seen in training maps to one shared unknown id, which training never targets."""

    HISTORY, EMBED, HIDDEN, STEPS, BATCH = 10, 32, 64, 300, 64

    def __init__(self, streams: list[Stream], normalizer: Normalizer) -> None:
        super().__init__(streams, normalizer)
        self.ids = {t: i for i, t in enumerate(self.counts)}  # template -> class
        self.unknown, self.start, self.end = len(self.ids), len(self.ids) + 1, len(self.ids) + 2
        n = len(self.ids) + 3
        self.embed = torch.nn.Embedding(n, self.EMBED)
        self.lstm = torch.nn.LSTM(self.EMBED, self.HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(self.HIDDEN, n)
        x = torch.cat(
            [self._windows(seq, stream.ended)[0] for seq, stream in zip(self.sequences, streams, strict=True)]
        )
        y = torch.cat(
            [self._windows(seq, stream.ended)[1] for seq, stream in zip(self.sequences, streams, strict=True)]
        )
        params = [*self.embed.parameters(), *self.lstm.parameters(), *self.head.parameters()]
        optimizer = torch.optim.Adam(params, lr=3e-3)
        gen = torch.Generator().manual_seed(0)
        for _ in range(self.STEPS):
            pick = torch.randint(0, len(y), (self.BATCH,), generator=gen)
            loss = F.cross_entropy(self._logits(x[pick]), y[pick])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def _windows(self, templates: list[int], ended: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(histories [n, HISTORY], next ids [n]) for every line of a stream (and its end)."""
        seq = [self.start] * self.HISTORY + [self.ids.get(t, self.unknown) for t in templates]
        seq += [self.end] if ended else []
        ids = torch.tensor(seq)
        n = len(seq) - self.HISTORY
        history = ids.unfold(0, self.HISTORY, 1)[:n]  # [n, HISTORY]
        return history, ids[self.HISTORY :]

    def _logits(self, history: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(history))  # [n, HISTORY, HIDDEN]
        return self.head(out[:, -1])  # [n, classes]

    @torch.no_grad()
    def score_stream(self, lines: list[str], ended: bool) -> tuple[list[float], float | None]:
        history, target = self._windows(self.templates(lines), ended)
        nll = F.cross_entropy(self._logits(history), target, reduction="none").tolist()
        return (nll[:-1], nll[-1]) if ended else (nll, None)


PEERS: dict[str, type[TemplateDetector]] = {
    "drain3_rarity": DrainRarity,
    "drain3_online": DrainOnline,
    "ngram_next_template": NgramNext,
    "deeplog_lstm": DeepLogLSTM,
}


def _evaluate_peer(
    peer_class: type[TemplateDetector], train_streams: list[Stream], test: list[Stream],
    labels: list[int], sessions: bool, quantile: float, normalizer: Normalizer,
) -> dict[str, Any]:  # fmt: skip
    """Fit on the baseline minus a held-out tenth, threshold = quantile of held-out scores (no labels)."""
    fit_streams, heldout = split_heldout(train_streams, 0.1)
    peer = peer_class(fit_streams, normalizer)

    def unit_scores(streams: list[Stream]) -> list[float]:
        out = []
        for s in streams:
            line_scores, end = peer.score_stream(s.lines, s.ended)
            out += [session_worst(line_scores, end)] if sessions else line_scores
        return out

    threshold = float(np.quantile(unit_scores(heldout), quantile))
    started = time.perf_counter()
    scores = np.array(unit_scores(test))
    seconds = time.perf_counter() - started
    return _metrics(scores, np.array(labels), threshold, sum(len(s.lines) for s in test) / seconds)


def _metrics(
    scores: np.ndarray, labels: np.ndarray, threshold: float, lines_per_second: float
) -> dict[str, Any]:
    precision, recall, f1 = precision_recall_f1(scores, labels, threshold)
    return {
        "f1": round(f1, 4), "precision": round(precision, 4), "recall": round(recall, 4),
        "best_f1": round(best_f1(scores, labels), 4), "auc_pr": round(auc_pr(scores, labels), 4),
        "lines_per_second": round(lines_per_second, 1),
    }  # fmt: skip


def _ours(options: ReplayOptions, data: ReplayInput) -> dict[str, Any]:
    summary = run_replay(options, data).summary()
    keys = ("f1", "precision", "recall", "best_f1", "auc_pr", "lines_per_second")
    return {k: summary[k] for k in keys}


def peers_section(config: BenchConfig, runs: Path, synthetic: Trained) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # synthetic incidents: the demo's incident log, one stream per host, line labels
    incident_log = generate_lines(3000, seed=7, incidents=INCIDENT_KINDS * 2, incident_start=0.2)
    records = parse_lines(incident_log.lines, STREAM_KEY)  # offset: the line's index
    test_streams = streams_from_records(records)
    by_stream: dict[str, list[int]] = {}  # stream -> line indices, in order
    for record in records:
        by_stream.setdefault(record.stream, []).append(record.offset or 0)
    labels = [incident_log.labels[i] for idx in by_stream.values() for i in idx]
    normalizer = Normalizer.from_json(synthetic.meta["mask_rules"])
    synthetic_out: dict[str, Any] = {
        "units": "lines", "lines": len(incident_log.lines), "positives": int(sum(incident_log.labels)),
    }  # fmt: skip
    for name, trained in (
        ("sinks_ring (ours)", synthetic),
        ("sinks_ring small", synthetic_model(config, runs, "small")),
    ):
        detector = Detector(
            trained.model, trained.tokenizer, trained.meta, window=config.window, device="cpu"
        )
        synthetic_out[name] = _ours(
            ReplayOptions(input=Path("synthetic"), format="lines"),
            ReplayInput(records, incident_log.labels, InputStats(), detector),
        )
    for name, peer in PEERS.items():
        synthetic_out[name] = _evaluate_peer(
            peer, synthetic_baseline(), test_streams, labels, False, 0.995, normalizer
        )
    out["synthetic"] = synthetic_out

    if not HDFS_SESSIONS.is_file():
        out["hdfs"] = {"skipped": f"{HDFS_SESSIONS} not found (run from the repo root, next to ../shared)"}
        return out
    sessions = read_sessions(HDFS_SESSIONS, InputStats())[: config.hdfs_sessions]
    cut = int(len(sessions) * 0.8)
    train_sessions, test_sessions = sessions[:cut], sessions[cut:]
    normal = streams_from_sessions([s for s in train_sessions if s.label == 0])
    hdfs_out: dict[str, Any] = {
        "units": "sessions", "sessions": len(test_sessions), "lines": sum(len(s.lines) for s in test_sessions),
        "positives": sum(s.label for s in test_sessions),
    }  # fmt: skip
    for name, preset in (("sinks_ring (ours)", "tiny"), ("sinks_ring small", "small")):
        train_config = TrainConfig(
            preset=preset,
            window=config.hdfs_window,
            fit_window=False,
            max_steps=config.max_steps,
        )
        trained = cached_train(runs, f"hdfs-{preset}", normal, train_config)
        detector = Detector(trained.model, trained.tokenizer, trained.meta, device="cpu")
        hdfs_out[name] = _ours(
            ReplayOptions(input=HDFS_SESSIONS, format="sessions"),
            ReplayInput(test_sessions, None, InputStats(), detector),
        )
    hdfs_normalizer = Normalizer.from_json(trained.meta["mask_rules"])
    for name, peer in PEERS.items():
        hdfs_out[name] = _evaluate_peer(
            peer,
            normal,
            streams_from_sessions(test_sessions),
            [s.label for s in test_sessions],
            True,
            0.999,
            hdfs_normalizer,
        )
    out["hdfs"] = hdfs_out
    return out


# -- the run -------------------------------------------------------------------------------------------------


@dataclass
class BenchRun:
    config: BenchConfig
    sections: tuple[str, ...] = SECTIONS
    runs: Path = Path("runs/bench")
    plots: Path | None = None
    results: dict[str, Any] = field(default_factory=dict)


def run_bench(run: BenchRun, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the selected sections; returns {"config": ..., section: result, "seconds": {...}}."""
    torch.set_num_threads(run.config.threads)
    results: dict[str, Any] = {
        "config": asdict(run.config),
        "threads": torch.get_num_threads(),
        "seconds": {},
    }
    started = time.perf_counter()
    synthetic = synthetic_model(run.config, run.runs)
    results["seconds"]["train_synthetic"] = round(time.perf_counter() - started, 1)
    for name in run.sections:
        progress(name)
        started = time.perf_counter()
        if name == "peers":
            results[name] = peers_section(run.config, run.runs, synthetic)
        else:
            results[name] = SECTION_FUNCTIONS[name](synthetic, run.config)
        results["seconds"][name] = round(time.perf_counter() - started, 1)
    if run.plots is not None:
        results["plots"] = [str(p) for p in write_plots(results, run.plots)]
    run.results = finite(results)
    return run.results


SECTION_FUNCTIONS: dict[str, Callable[[Trained, BenchConfig], dict[str, Any]]] = {
    "table": table_section, "constant": constant_section, "streams": streams_section, "ablation": ablation_section,
}  # fmt: skip


def finite(value: Any) -> Any:
    """The results with NaN as None, so that the JSON is standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def with_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


# -- output: markdown tables and plots -------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _markdown(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows])


def render(results: dict[str, Any]) -> str:
    """The results as markdown tables, one per section that ran."""
    out = []
    if table := results.get("table"):
        rows = []
        for method, cells in table["methods"].items():
            for c in cells:
                ms = c.get(
                    "ms_per_line",
                    f"~{c['ms_per_line_estimated'] / 1000:,.0f} s (est.)"
                    if "ms_per_line_estimated" in c
                    else None,
                )
                rows.append([method, c["lines"], ms, c.get("peak_rss_mib"), round(c["kv_bytes"] / 1024, 1),
                             c.get("perplexity"), c.get("auc_pr"), c["status"]])  # fmt: skip
        out.append(
            _markdown(
                [
                    "method",
                    "stream lines",
                    "ms/line (p50)",
                    "peak RSS MiB",
                    "KV KiB",
                    "perplexity",
                    "AUC-PR",
                    "status",
                ],
                rows,
            )
        )
    if constant := results.get("constant"):
        rows = [
            [p["lines"], p["p50_ms"], p["p99_ms"], p["rss_mib"], p["cache_bytes"]] for p in constant["points"]
        ]
        out.append(_markdown(["lines so far", "p50 ms", "p99 ms", "RSS MiB", "cache bytes"], rows))
        out.append(
            f"after warm-up: p50 largest deviation {constant['p50_fluctuation']:.1%}, p50 drift "
            f"{constant['p50_drift']:+.1%}, RSS largest deviation {constant['rss_fluctuation']:.1%}, "
            f"cache bytes constant: {constant['cache_bytes_constant']}, {constant['bulk_lines_per_second']:,} lines/s overall"
        )
    if streams := results.get("streams"):
        rows = [
            [
                r["streams"],
                r["lines_per_second"],
                r["ms_per_round"],
                round(r["cache_bytes"] / MiB, 2),
                r["peak_rss_mib"],
            ]
            for r in streams["rows"]
        ]
        out.append(_markdown(["streams", "lines/s", "ms per batch", "cache MiB", "peak RSS MiB"], rows))
    if ablation := results.get("ablation"):
        rows = [
            [
                m,
                r["perplexity"],
                r["auc_pr"],
                r["score_before_roll"],
                r["score_after_roll"],
                r["score_steady"],
            ]
            for m, r in ablation["modes"].items()
        ]
        out.append(
            _markdown(
                [
                    "sinks",
                    "perplexity",
                    "AUC-PR",
                    "score before roll",
                    "score, 5 lines after roll",
                    "score, steady",
                ],
                rows,
            )
        )
    if peers := results.get("peers"):
        for dataset, methods in peers.items():
            rows = [
                [name, r["f1"], r["best_f1"], r["auc_pr"], r["lines_per_second"]]
                for name, r in methods.items()
                if isinstance(r, dict)
            ]
            out.append(
                f"{dataset}:\n"
                + _markdown(["detector", "F1 (calibrated)", "best F1", "AUC-PR", "lines/s"], rows)
                if rows
                else f"{dataset}: {methods}"
            )
    return "\n\n".join(out)


def write_plots(results: dict[str, Any], directory: Path) -> list[Path]:
    """PNG plots of the sections that ran; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(directory / name, dpi=110)
        plt.close(fig)
        written.append(directory / name)

    if constant := results.get("constant"):
        points = constant["points"]
        x = [p["lines"] for p in points]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        left.plot(x, [p["p50_ms"] for p in points], "o-", label="p50")
        left.plot(x, [p["p99_ms"] for p in points], "s--", label="p99")
        left.set(
            xlabel="lines into the stream", ylabel="ms per line", title="latency per line", ylim=(0, None)
        )
        left.legend()
        right.plot(x, [p["rss_mib"] for p in points], "o-", label="process RSS")
        right.set(xlabel="lines into the stream", ylabel="process RSS (MiB)", title="memory")
        right.set_ylim(0, 1.25 * max(p["rss_mib"] for p in points))
        cache = right.twinx()
        cache.plot(
            x, [p["cache_bytes"] / 1024 for p in points], "s--", color="tab:orange", label="stream cache"
        )
        cache.set(ylabel="stream cache (KiB)", ylim=(0, 1.5 * max(p["cache_bytes"] / 1024 for p in points)))
        right.legend(handles=right.get_lines() + cache.get_lines(), loc="lower right")
        save(fig, "bench_constant_cost.png")
    if table := results.get("table"):
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        for method, cells in table["methods"].items():
            ok = [c for c in cells if c["status"] == "ok"]
            left.plot([c["lines"] for c in ok], [c["ms_per_line"] for c in ok], "o-", label=method)
            right.plot([c["lines"] for c in ok], [c["perplexity"] for c in ok], "o-", label=method)
        left.set(
            xscale="log", yscale="log", xlabel="stream length (lines)", ylabel="ms per line", title="cost"
        )
        right.set(
            xscale="log", yscale="log", xlabel="stream length (lines)", ylabel="perplexity", title="quality"
        )
        left.legend(fontsize=8)
        save(fig, "bench_streaming_table.png")
    if streams := results.get("streams"):
        rows = streams["rows"]
        fig, ax = plt.subplots(figsize=(5, 3.6))
        ax.plot([r["streams"] for r in rows], [r["lines_per_second"] for r in rows], "o-")
        ax.set(xscale="log", xlabel="streams batched", ylabel="lines/s", title="many streams", ylim=(0, None))
        save(fig, "bench_many_streams.png")
    if ablation := results.get("ablation"):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for mode, r in ablation["modes"].items():
            ax.plot(r["mean_score_by_line"], label=mode)
        ax.axvline(ablation["roll_line_median"], color="grey", linestyle=":", label="window starts to roll")
        ax.set(
            xlabel="line of the stream",
            ylabel="mean line score (nats)",
            title=f"sink ablation, L = {ablation['window']}",
        )
        ax.legend(fontsize=8)
        save(fig, "bench_sink_ablation.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, under 2 minutes)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    parser.add_argument(
        "--stream-lines", type=int, help="length of the constant-cost stream (full run: 200000)"
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default 1)")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench"), help="cache of the models it trains")
    parser.add_argument("--plots", type=Path, help="write PNG plots into this folder")
    args = parser.parse_args()
    config = with_overrides(
        QUICK if args.quick else FULL, stream_lines=args.stream_lines, threads=args.threads
    )
    sections = tuple(s for s in SECTIONS if not args.only or s in args.only)
    run = BenchRun(config=config, sections=sections, runs=args.runs, plots=args.plots)
    results = run_bench(run, progress=lambda name: print(f"bench: {name}", file=sys.stderr, flush=True))
    print(render(results), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
