"""Detection on raw, unlabeled logs: the dev sets of docs/quality.md, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/unsupervised_quality.py [--out runs/unsupervised] [--seed N]

What a new user's first backtest does, with every default: `logstream replay FILE
--auto-train all` (prequential: every line scored by a model that never saw it). The dev
sets are loghub's Linux, OpenSSH and Thunderbird samples with seeded, real-looking
incidents injected (`logstream.incidents`), and Thunderbird as it is: a clean real log,
where every flag is a false alarm.

For each set it prints line AUC-PR, F1 and false alarms per 1,000 normal lines at the
default sensitivity, for:
- logstream (defaults), and logstream with each piece removed (ablations): the calibrated
  unit (raw nats, each model's own quantile threshold), the GPD tail (empirical tail
  only), severity from content (level field only), the online (DSPOT) refits of the tail,
  the line score's words (its top 3 of tokens instead), the second, capped statistic (the
  top 3 words alone); and with novelty added (its default weight is 0: measured not to help);
- peers without a model: a severity-only rule (error/critical words or level), Drain
  rarity offline (template frequency over the whole file) and online (so far), and
  severity then online rarity.
Peers' F1: a template's rarity p = its share of lines, flagged at p < 1e-3 (`PEER_RARITY`);
the severity rule flags error and critical lines.
HDFS (clean and contaminated baselines) comes from `benchmarks/hdfs_quality.py`; its
results are included when their JSON is in --hdfs-runs.

`--other-logs` scores, with every default, each other loghub sample in --data (no labels,
not used to set anything): alerts per 1,000 lines in each prequential chunk, at the old
default rate (1e-3) and the current one. Not all of them are false alarms.

`--bursts` puts one incident of another shape in each dev log: 30 lines of a failing disk
(`incidents.inject_burst`), early (in the first chunk, which its model trains on) or late,
and counts the burst lines that alert and the other alerts per 1,000 lines.

`--halves` is the issue's new-user case: `logstream train` with every default on the first
half of each dev log, then the second half, with incidents injected at seeds 0-4 (2 of each
kind per seed), scored by that model (as `replay --model`): lines caught per kind, false
alarms per 1,000 normal lines, and AUC-PR / F1 over the five seeds' lines together; and
(`tokens`) how the model sees the lines it does not know (`unseen_tokens`).

`--bluegene` needs no data: three logs in BlueGene/L's RAS layout (`incidents.bluegene_log`;
loghub's BGL, of which no sample is here), each with ten bursts of alerts that many nodes
report at once, some followed by register dumps (FATAL lines that BGL labels normal):
AUC-PR, F1 and false alarms per 1,000 lines with every default, beside the severity peers.
A smoke test of a format, written from its published description, not a real log.

`--quiet` needs no model: sources that stop logging (`logstream.quiet`, at the default
rate) in each loghub sample with syslog headers. As it is, every quiet source it names is
a false alarm or an outage nobody labeled. Then each source the watch can judge by the
log's middle (tail.MIN_SAMPLES gaps before it, lines after it) is stopped there
(`incidents.stop_source`), one at a time: is it noticed, how long after its last line,
and how many other sources are called quiet. `us_per_line`: the watch's own time a line,
best of QUIET_TIMING_PASSES over the log as it is (also run for logs without a header).
`restart_cold` / `restart_baseline`: a watch that starts at the middle (a new replay of the
second half, a restarted serve), without and with the first half's rhythms
(`quiet.learn_baseline`, what `train` saves): each judged source logs once more, then
stops (`noticed`), and the second half as it is (`quiet_as_is`).

Chunk models are cached in --out/<set>/part-<k>; delete them after a training change.
The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from hdfs_quality import DEFAULT_VARIANT

from logstream.detector import Detector
from logstream.incidents import (
    BLUEGENE_ALERTS,
    INCIDENT_KINDS,
    bluegene_log,
    inject,
    inject_burst,
    stop_source,
    strip_label_column,
)
from logstream.inputs import InputStats, parse_lines, streams_from_lines
from logstream.model import load_model_dir, save_model_dir
from logstream.normalize import Normalizer
from logstream.patterns import PatternMiner
from logstream.quiet import Baseline, QuietWatch, learn_baseline, source_of
from logstream.records import LogRecord, Stream
from logstream.replay import (
    Part,
    ReplayInput,
    ReplayOptions,
    ReplayProgress,
    ReplayReport,
    score_parts,
    to_streams,
    train_parts,
)
from logstream.scoring import DEFAULT_FALSE_ALARM_RATE, ScoringConfig, auc_pr, precision_recall_f1, unseen
from logstream.severity import SEVERITY_RANK, line_severity
from logstream.tail import MIN_SAMPLES
from logstream.train import TrainConfig, calibrate, heldout_split, train

LOGHUB = Path(__file__).resolve().parents[2] / "shared" / "data" / "loghub"
HDFS_KEYS = ("f1", "precision", "recall", "auc_pr")
# The rarity peers flag a template seen in under this share of the lines so far: 1 in 1,000, a
# template seen once in a 2,000-line log. (A frequency, not logstream's tail probability: at
# its default of 3e-4 no template of a 2,000-line log could be that rare.)
PEER_RARITY = 1e-3


@dataclass(frozen=True)
class DevSet:
    name: str
    file: str
    seed: int | None  # None: no injection (a clean log)
    label_column: bool = False  # Thunderbird's first column is its alert label


DEV_SETS = (
    DevSet("linux", "Linux_2k.log", seed=1),
    DevSet("openssh", "OpenSSH_2k.log", seed=2),
    DevSet("thunderbird", "Thunderbird_2k.log", seed=3, label_column=True),
    DevSet("thunderbird-clean", "Thunderbird_2k.log", seed=None, label_column=True),
)

# name -> changes to the default ScoringConfig (the ablations of issue 10's points 1-4)
VARIANTS: dict[str, dict[str, object]] = {
    "logstream": {},
    "- calibrated unit (raw nats, per-model quantile)": {"tail_model": "raw"},
    "- GPD tail (empirical tail only)": {"tail_model": "empirical"},
    "- severity from content (level field only)": {"content_severity": False},
    "- online refits (the held-out tail only)": {"refit_every": 0},
    "- words (the top 3 of tokens, the default before stop 14)": {"line_unit": "token"},
    "- capped statistic (the top 3 words alone, the default before stop 30)": {"capped_top_k": 0},
    "- crash words (the critical prior in the evidence alone, before stop 34)": {"crash_words": False},
    "- following alerts (each line judged alone, before stop 35)": {"follow_alerts": False},
    "- following the same process (a follower names a failure, before stop 36)": {
        "follow_same_process": False
    },
    "+ template centering (a known template against its usual surprise; default off)": {
        "template_centering": True
    },
    "+ burst discount (log(1 + repeats in 128 lines) nats off; default off)": {"repeat_window": 128},
    "+ novelty (1 nat for a template new to the model)": {"novelty": 1.0},
}


def load_set(dev: DevSet, data: Path) -> tuple[list[str], list[int], list[str | None]]:
    lines = (data / dev.file).read_text(encoding="utf-8", errors="replace").splitlines()
    lines = [strip_label_column(line) if dev.label_column else line for line in lines if line.strip()]
    if dev.seed is None:
        return lines, [0] * len(lines), [None] * len(lines)
    log = inject(lines, seed=dev.seed)
    return log.lines, log.labels, log.kinds


def prequential(
    name: Path, lines: list[str], labels: list[int] | None, config: TrainConfig, cache: Path
) -> tuple[ReplayOptions, ReplayInput, list[Part]]:
    """`replay NAME --auto-train all` of `lines`: its options, input and chunk models (cached)."""
    data = ReplayInput(parse_lines(lines), labels, InputStats(), None)
    options = ReplayOptions(input=name, auto_train="all", train_config=config)
    return options, data, cached_parts(options, data, cache)


def cached_parts(options: ReplayOptions, data: ReplayInput, cache: Path) -> list[Part]:
    """The prequential chunk models (`--auto-train all`), trained once and kept in `cache`."""
    index = cache / "parts.json"
    if index.is_file():
        return [
            Part(first, n, Detector.load(cache / f"part-{k}"), (lo, hi))
            for k, (first, n, lo, hi) in enumerate(json.loads(index.read_text()))
        ]
    progress = ReplayProgress(phase=lambda description, total: print(f"  {description}", flush=True))
    parts = train_parts(options, data, progress)
    for k, part in enumerate(parts):
        d = part.detector
        save_model_dir(cache / f"part-{k}", d.engine.model, d.tokenizer, d.meta)
    index.write_text(json.dumps([[p.first, p.count, *p.trained_on] for p in parts]))
    return parts


def evaluate(scores: np.ndarray, flagged: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    negatives = int((labels == 0).sum())
    out: dict[str, float | None] = {
        "false_alarms_per_1000": round(1000 * int((flagged & (labels == 0)).sum()) / negatives, 2),
        "auc_pr": None,
        "f1": None,
        "recall": None,
    }
    if labels.sum():
        _, recall, f1 = precision_recall_f1(flagged.astype(float), labels, 0.5)
        out |= {"auc_pr": round(auc_pr(scores, labels), 3), "f1": round(f1, 3), "recall": round(recall, 3)}
    return out


def caught(flagged: Sequence[bool], kinds: list[str | None]) -> dict[str, str]:
    """Incident lines flagged / injected, per kind present."""
    return {
        kind: f"{sum(f for f, k in zip(flagged, kinds, strict=True) if k == kind)}/{kinds.count(kind)}"
        for kind in (*INCIDENT_KINDS, *BLUEGENE_ALERTS)
        if kind in kinds
    }


def score_with(parts: list[Part], data: ReplayInput, config: ScoringConfig) -> ReplayReport:
    """Every chunk model calibrated afresh with `config` on its own held-out lines, then the replay."""
    options = ReplayOptions(input=Path("-"))
    for part in parts:
        assert part.trained_on is not None
        _, heldout = heldout_split(to_streams(options, data, data.slice(*part.trained_on)), TrainConfig())
        calibrate(part.detector, heldout, config)
    return score_parts(options, data, parts)


def run_variants(
    parts: list[Part], data: ReplayInput, kinds: list[str | None], only: Sequence[str] = tuple(VARIANTS)
) -> dict[str, dict]:
    labels = np.array(data.labels)
    results = {}
    for name in only:
        changes = VARIANTS[name]
        columns = score_with(parts, data, replace(ScoringConfig(), **changes)).columns
        scores, flagged = columns.scores(), columns.flagged() > 0
        results[name] = evaluate(scores, flagged, labels[columns.numpy("index")])
        if name == "logstream":
            results[name]["caught"] = caught(flagged, kinds)
    return results


def peers(lines: list[str], labels: np.ndarray) -> dict[str, dict]:
    """Rule-based peers: no model, the same lines and labels."""
    normalizer = Normalizer()
    masked = [normalizer.mask(line) for line in lines]
    offline = PatternMiner()
    template_of = [offline.add(m).template_id for m in masked]
    counts = Counter(template_of)
    online, seen = PatternMiner(), Counter()
    online_p = []
    for i, m in enumerate(masked, start=1):
        t = online.add(m).template_id
        seen[t] += 1
        online_p.append(seen[t] / i)
    rank = np.array([SEVERITY_RANK.get(line_severity(line) or "", 0) for line in lines], dtype=float)
    offline_p = np.array([counts[t] / len(lines) for t in template_of])
    online_p_arr = np.array(online_p)
    limit = PEER_RARITY
    online_rarity = -np.log10(online_p_arr)
    return {
        "severity rule": evaluate(rank, rank >= SEVERITY_RANK["error"], labels),
        "Drain rarity (offline)": evaluate(-np.log10(offline_p), offline_p < limit, labels),
        "Drain rarity (online)": evaluate(online_rarity, online_p_arr < limit, labels),
        "severity, then online rarity": evaluate(
            rank * 10 + np.minimum(online_rarity, 9.99),
            (rank >= SEVERITY_RANK["error"]) & (online_p_arr < math.sqrt(limit)),
            labels,
        ),
    }


def other_logs(data_dir: Path, out: Path, config: TrainConfig) -> dict[str, dict]:
    """Alerts per 1,000 lines, per chunk, on each loghub sample that is not a dev set."""
    dev_files = {dev.file for dev in DEV_SETS}
    results = {}
    for path in sorted(data_dir.glob("*_2k.log")):
        if path.name in dev_files:
            continue
        dev = DevSet(path.name.removesuffix("_2k.log").lower(), path.name, seed=None)
        lines, labels, _ = load_set(dev, data_dir)
        _, data, parts = prequential(path, lines, labels, config, out / dev.name)
        row = {}
        for rate in (1e-3, DEFAULT_FALSE_ALARM_RATE):
            chunks = score_with(parts, data, ScoringConfig(false_alarm_rate=rate)).chunks
            row[f"{rate:g}"] = [round(1000 * c.anomalies / c.items, 1) for c in chunks]
        results[dev.name] = row
        print(f"  {dev.name:10s} alerts per 1,000 lines in each chunk: {row}", flush=True)
    return results


BURST_AT = (0.3, 0.75)  # where the burst goes: in the first chunk (trained on), in the second


def bursts(data_dir: Path, out: Path, config: TrainConfig) -> dict[str, dict]:
    """One 30-line disk-error burst (`incidents.inject_burst`) in each dev log, early (inside
    the first chunk, which its model trains on) or late (in the second): burst lines that
    alert, and other alerts per 1,000 lines, with every default."""
    results: dict[str, dict] = {}
    for dev in DEV_SETS:
        if dev.seed is None:
            continue
        lines, _, _ = load_set(replace(dev, seed=None), data_dir)
        for at in BURST_AT:
            log = inject_burst(lines, after=int(len(lines) * at))
            cache = out / f"{dev.name}-burst-{at}"
            options, data, parts = prequential(Path(dev.file), log.lines, log.labels, config, cache)
            columns = score_parts(options, data, parts).columns
            flagged, labels = columns.flagged() > 0, np.array(log.labels)[columns.numpy("index")]
            row = {
                "burst_lines_flagged": f"{int((flagged & (labels == 1)).sum())}/{int(labels.sum())}",
                "other_alerts_per_1000": round(1000 * float((flagged & (labels == 0)).sum()) / len(lines), 1),
            }
            results[f"{dev.name}, burst at {at:.0%}"] = row
            print(f"  {dev.name:12s} burst at {at:.0%}: {row}", flush=True)
    return results


BLUEGENE_SEEDS = range(3)  # logs of --bluegene


def bluegene(out: Path, config: TrainConfig) -> dict[str, dict]:
    """Logs in BlueGene/L's layout with bursts of alerts (`incidents.bluegene_log`), each
    through `replay --auto-train all` with every default, beside the severity peers."""
    results: dict[str, dict] = {}
    for seed in BLUEGENE_SEEDS:
        log = bluegene_log(seed)
        name = f"bluegene-{seed}"
        _, data, parts = prequential(Path(f"{name}.log"), log.lines, log.labels, config, out / name)
        table = run_variants(parts, data, log.kinds, only=("logstream",))
        results[name] = table | peers(log.lines, np.array(log.labels))
        print(f"  {name}: {sum(log.labels)} alerts in {len(log.lines)} lines, {table}", flush=True)
    return results


HALVES_SEEDS = range(5)  # injection seeds of --halves


def unseen_tokens(token_nll: list[np.ndarray], labels: list[int], vocab_size: int) -> dict[str, float | None]:
    """What the model says of lines it does not know (`scoring.unseen`: the model is closer to
    a uniform guess than to knowing them). Median token NLL of the incident lines and of the
    unseen normal ones, and how many normal lines per 1,000 are unseen."""
    median = np.array([float(np.median(nll)) if len(nll) else 0.0 for nll in token_nll])
    incident = np.array(labels) == 1
    unseen_normal = np.array([unseen(nll, vocab_size) for nll in token_nll]) & ~incident
    return {
        "ln_vocab": round(math.log(vocab_size), 2),
        "incident_median": round(float(np.median(median[incident])), 2),
        "unseen_normal_median": round(float(np.median(median[unseen_normal])), 2)
        if unseen_normal.any()
        else None,
        "unseen_normal_per_1000": round(1000 * float(unseen_normal.sum()) / int((~incident).sum()), 1),
    }


def halves(data_dir: Path, out: Path, config: TrainConfig) -> dict[str, dict]:
    """Train on each dev log's first half with every default; score its second half with
    incidents injected at each of HALVES_SEEDS by a fresh copy of that model."""
    results: dict[str, dict] = {}
    for dev in DEV_SETS:
        if dev.seed is None:
            continue
        lines, _, _ = load_set(replace(dev, seed=None), data_dir)
        half = len(lines) // 2
        model_dir = out / f"{dev.name}-first-half"
        if not (model_dir / "logstream.json").is_file():
            trained = train(streams_from_lines(lines[:half]), config)
            save_model_dir(model_dir, trained.model, trained.tokenizer, trained.meta)
        model, tokenizer, meta = load_model_dir(model_dir)
        scores, flagged, labels, kinds, token_nll = [], [], [], [], []
        for injection in HALVES_SEEDS:
            later = inject(lines[half:], seed=injection)
            records = [LogRecord(line=line) for line in later.lines]
            # each pass from fresh stream state (rings, online tail), as one replay of the file
            scored = Detector(model, tokenizer, meta).score(records)
            scores += [line.score for line in scored]
            flagged += [line.is_anomaly for line in scored]
            labels += later.labels
            kinds += later.kinds
            token_nll += Detector(model, tokenizer, meta).token_surprisal(records)[2]
        row = evaluate(np.array(scores), np.array(flagged), np.array(labels))
        row["caught"] = caught(flagged, kinds)
        row["tokens"] = unseen_tokens(token_nll, labels, model.config.vocab_size)
        results[dev.name] = row
        print(f"  {dev.name:12s} {row}", flush=True)
    return results


def quiet_lines(
    lines: list[str], threshold: float, baseline: Baseline | None = None
) -> list[tuple[int, str, float]]:
    """(line index, source, s since its last line) of each quiet source the watch names."""
    watch = QuietWatch()
    return [
        (i, q.source, q.noticed_at - q.last_seen)
        for i, line in enumerate(lines)
        for q in watch.observe("log", line, threshold, baseline)
    ]


def restarted(lines: list[str], judged: list[str], threshold: float, baseline: Baseline | None) -> dict:
    """A watch that starts at the log's middle (a new replay, a restarted serve), with or
    without the first half's `baseline`: each judged source logs once more, then stops
    (noticed?), and the second half as it is (quiet sources named)."""
    later = lines[len(lines) // 2 :]
    noticed = 0
    for source in judged:
        first = next(i for i, line in enumerate(later) if (found := source_of(line)) and found[0] == source)
        events = quiet_lines(stop_source(later, source, first + 1), threshold, baseline)
        noticed += any(s == source for _, s, _ in events)
    as_is = quiet_lines(later, threshold, baseline)
    return {"noticed": f"{noticed}/{len(judged)}", "quiet_as_is": len(as_is)}


QUIET_TIMING_PASSES = 7


def watch_us_per_line(lines: list[str], threshold: float) -> float:
    """The watch's time a line, best of QUIET_TIMING_PASSES fresh watches over `lines`."""
    best = math.inf
    for _ in range(QUIET_TIMING_PASSES):
        watch, started = QuietWatch(), time.perf_counter()
        for line in lines:
            watch.observe("log", line, threshold)
        best = min(best, time.perf_counter() - started)
    return round(1e6 * best / len(lines), 1)


def quiet(data_dir: Path) -> dict[str, dict]:
    """Each syslog-format loghub sample as it is, then with each judgeable source stopped at
    its middle: quiet sources named, and the stopped ones noticed."""
    threshold = -math.log10(DEFAULT_FALSE_ALARM_RATE)
    results: dict[str, dict] = {}
    for path in sorted(data_dir.glob("*_2k.log")):
        dev = DevSet(
            path.name.removesuffix("_2k.log").lower(), path.name, None, path.name.startswith("Thunderbird")
        )
        lines, _, _ = load_set(dev, data_dir)
        sources = [source_of(line) for line in lines]
        if not any(sources):
            results[dev.name] = {"with_header": 0, "us_per_line": watch_us_per_line(lines, threshold)}
            continue
        middle = len(lines) // 2
        visits: dict[str, set[int]] = {}  # the seconds each source logged in, as the watch counts them
        for found in sources[:middle]:
            if found is not None:
                visits.setdefault(found[0], set()).add(math.floor(found[1]))
        later = Counter(found[0] for found in sources[middle:] if found is not None)
        judged = sorted(s for s, seen in visits.items() if len(seen) > MIN_SAMPLES and later[s])
        as_is = quiet_lines(lines, threshold)
        stopped, others = {}, []
        for source in judged:
            events = quiet_lines(stop_source(lines, source, middle), threshold)
            noticed = [silent for i, s, silent in events if s == source and i >= middle]
            stopped[source] = f"{noticed[0] / 60:.1f} min" if noticed else "missed"
            others.append(sum(s != source for _, s, _ in events))
        row = {
            "lines": len(lines),
            "with_header": sum(found is not None for found in sources),
            "quiet_as_is": len(as_is),
            "quiet_as_is_per_1000": round(1000 * len(as_is) / len(lines), 1),
            "quiet_as_is_sources": sorted({s for _, s, _ in as_is}),
            "stopped_noticed": f"{sum(v != 'missed' for v in stopped.values())}/{len(judged)}",
            "noticed_after": stopped,
            "other_quiet_per_1000": round(1000 * float(np.mean(others)) / len(lines), 1) if others else None,
            "us_per_line": watch_us_per_line(lines, threshold),
            # after a restart at the middle: cold, and from the first half's rhythms
            "restart_cold": restarted(lines, judged, threshold, None),
            "restart_baseline": restarted(
                lines, judged, threshold, learn_baseline([Stream("log", lines[:middle])])
            ),
        }
        results[dev.name] = row
        print(f"  {dev.name:12s} {row}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=LOGHUB)
    parser.add_argument("--out", type=Path, default=Path("runs/unsupervised"))
    parser.add_argument("--hdfs-runs", type=Path, default=Path("runs"))
    parser.add_argument("--sets", nargs="*", default=[d.name for d in DEV_SETS])
    parser.add_argument("--seed", type=int, default=0, help="training seed (give each its own --out)")
    parser.add_argument("--other-logs", action="store_true", help="score the other loghub samples instead")
    parser.add_argument("--bursts", action="store_true", help="a 30-line burst in each dev log instead")
    parser.add_argument(
        "--halves", action="store_true", help="train on each dev log's first half, score its second instead"
    )
    parser.add_argument("--quiet", action="store_true", help="sources that stop logging instead (no model)")
    parser.add_argument(
        "--bluegene", action="store_true", help="logs in BlueGene/L's layout with alert bursts instead"
    )
    parser.add_argument(
        "--merge-across-words", action="store_true", help="the tokenizer's merges cross spaces"
    )
    args = parser.parse_args()
    config = TrainConfig(seed=args.seed, merge_across_words=args.merge_across_words)

    if args.quiet:
        print(json.dumps(quiet(args.data)))
        return
    if args.other_logs:
        print(json.dumps(other_logs(args.data, args.out, config)))
        return
    if args.bursts:
        print(json.dumps(bursts(args.data, args.out, config)))
        return
    if args.halves:
        print(json.dumps(halves(args.data, args.out, config)))
        return
    if args.bluegene:
        print(json.dumps(bluegene(args.out, config)))
        return
    results: dict[str, dict] = {}
    for dev in DEV_SETS:
        if dev.name not in args.sets:
            continue
        started = time.time()
        print(f"{dev.name}:", flush=True)
        lines, labels, kinds = load_set(dev, args.data)
        _, data, parts = prequential(Path(dev.file), lines, labels, config, args.out / dev.name)
        table = run_variants(parts, data, kinds) | peers(lines, np.array(labels))
        results[dev.name] = {"lines": len(lines), "incident_lines": int(sum(labels)), "methods": table}
        print(f"  {len(lines)} lines, {sum(labels)} injected, {time.time() - started:.0f} s")
        for name, row in table.items():
            print(f"  {name:50s} " + "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    for name in ("hdfs", "hdfs-contaminated"):
        path = args.hdfs_runs / name / "results.json"
        if path.is_file():
            hdfs = json.loads(path.read_text())
            results[name] = {k: hdfs[DEFAULT_VARIANT][k] for k in HDFS_KEYS} | {
                "ceiling_f1": hdfs["ceiling_f1"]
            }
            print(f"{name}: {results[name]}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
