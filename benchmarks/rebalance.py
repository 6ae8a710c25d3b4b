"""A measured rebalance: false alarms, lag and restore time when `serve` replicas move.

Two parts on a real Kafka broker (KRaft, support/kafka_broker.py; run .ci/kafka.sh first), and
the model check of the second (`copy`) without one:

`restore`: how long the changelog restore takes per 1,000 streams. It writes N stream
states (L random token ids each, the tiny model's vocabulary) to a changelog topic, then
times what `serve` does on assignment: `Changelog.read` (the topic -> the latest state per
stream) and `StreamBook.restore` (serve's engine: the most recent 64 streams re-encoded,
the rest parked), and separately the re-encoding of one stream at L (engine only, all
streams re-encoded), scaled to 1,000.

`moves`: a steady producer of synthetic logs (logstream/evaluation/synth.py) with injected incidents,
`--clusters` copies of the generator, each host a stream keyed by `c<j>-<host>` (so keys
hash over the partitions). By default (`--workload sessions`) each stream carries a session
id on every line, new every 20-60 lines (`synth.with_sessions`): context a model can only
have from the stream's own recent lines, as a pod, job or user id is in real streams. The
default model is trained on that workload (`train_model`), and `copy_check` (also alone:
`copy`) reports whether it copies the id from context (the id's surprisal with and without
the stream's lines). Replicas of `serve` move on a schedule: 1 -> 2 at 20%, a kill -9 of
one (restarted at once, as a pod would be) at 40%, 2 -> 4 at 60%, 4 -> 2 at 80%. The same
messages are scored by a single replica that never moves (the reference), and the moves run
with the changelog, without it, and without it but with the cold-start policy
(`state.min_context_lines` = `--policy-lines`; the other runs set it to 0). Reported per
run: incidents found, false alarms (flagged normal lines) in all and among lines produced in the `--window`
seconds after each move, the largest lag after each move (the group's end offsets minus its
committed offsets, sampled every 0.5 s), and the restore times serve logged.

    .venv/bin/python benchmarks/rebalance.py restore [--streams 1000] [--window 2048]
    .venv/bin/python benchmarks/rebalance.py copy [--model DIR] [--false-alarm-rate R]
    .venv/bin/python benchmarks/rebalance.py moves [--seconds 100] [--rate 30] [--model DIR]
        [--runs changelog cold cold+policy] [--policy-lines 1] [--refit-every N] [--workload plain]

The last stdout line is the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # replicas and the broker share the cores
# the broker and the synthetic model, shared with the tests
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import httpx
import numpy as np
import yaml
from aiokafka import AIOKafkaProducer
from kafka_broker import KafkaBroker, committed_offsets, create_topic, end_offsets, free_port, produce
from synthetic_model import train_synthetic_model

from logstream.consumers.inputs import parse_lines, streams_from_lines
from logstream.detector import Detector
from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, SyntheticLog, generate_lines, with_sessions
from logstream.kafka_state import Changelog, StreamBook, StreamState
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.settings import KafkaSettings, StateSettings

WAIT_S = 300.0
PARTITIONS = 4
SCHEDULE = ((0.2, "1 -> 2"), (0.4, "kill -9"), (0.6, "2 -> 4"), (0.8, "4 -> 2"))


# -- the model ----------------------------------------------------------------------------------


def train_model(out: Path, window: int = 256, steps: int = 2500) -> Path:
    """tiny, trained on the workload (synthetic lines with sessions, logstream/evaluation/synth.py): about
    10 minutes on 2 busy cores."""
    log = with_sessions(generate_lines(30000, seed=1), seed=1)
    config = TrainConfig(
        preset="tiny", window=window, fit_window=False, seed=0, max_steps=steps, batch_size=16,
    )  # fmt: skip
    save(train(streams_from_lines(log.lines, STREAM_KEY), config), out)
    return out


def id_tokens(detector: Detector, ids: list[int]) -> int:
    """How many of a line's last tokens (before the newline) spell its 6-letter session id."""
    text, n = "", 0
    while len(text) < 6:
        n += 1
        text = detector.tokenizer.token_text(ids[-1 - n]) + text
    return n


def copy_check(detector: Detector, log: SyntheticLog) -> dict[str, float]:
    """Does the model copy a session id from context? Over the lines that are not `opened`
    lines: the mean surprisal (nats) of the id's tokens, and the line score (-log10 p, serve's
    path), each line scored in its stream's context and alone (a fresh stream)."""
    records = parse_lines(log.lines, STREAM_KEY)
    detector.online = detector.online_capped = None  # the model's own tails, not refitted: one scale
    warm: dict[str, list[float]] = {"id_nats": [], "score": []}
    cold: dict[str, list[float]] = {"id_nats": [], "score": []}
    for record in records:
        alone = replace(record, stream="alone")
        for out, scored in ((warm, record), (cold, alone)):
            _, ids, nll = detector.token_surprisal([scored])
            if scored is alone:
                detector.engine.drop("alone")
            if "session: opened" not in record.line:
                n = id_tokens(detector, ids[0])
                out["id_nats"].append(float(nll[0][-1 - n : -1].mean()))
    detector.reset()
    for record in records:  # again, through Detector.score this time, as serve scores
        for out, scored in ((warm, record), (cold, replace(record, stream="alone"))):
            line = detector.score([scored])[0]
            detector.engine.drop("alone")
            detector.recent.drop("alone")
            if "session: opened" not in record.line:
                out["score"].append(line.score)
    threshold = detector.threshold
    return {
        "lines": len(warm["score"]),
        "threshold": round(threshold, 2),
        **{
            f"{name}_{how}": value
            for how, got in (("in_context", warm), ("alone", cold))
            for name, value in (
                ("id_nats", round(float(np.mean(got["id_nats"])), 3)),
                ("median_score", round(float(np.median(got["score"])), 2)),
                ("share_over_threshold", round(float(np.mean(np.asarray(got["score"]) > threshold)), 4)),
            )
        },
    }


def with_refit_every(model: Path, out: Path, refit_every: int) -> Path:
    """A copy of the model directory whose online tail refits every `refit_every` unflagged
    lines (0: never), to tell the refits' share of the drift after a move from the context's."""
    shutil.copytree(model, out)
    meta = json.loads((out / "logstream.json").read_text())
    meta["calibration"]["config"]["refit_every"] = refit_every
    (out / "logstream.json").write_text(json.dumps(meta))
    return out


def run_copy_check(model: Path, seed: int, false_alarm_rate: float | None) -> dict[str, float]:
    """`copy_check` on 600 lines the model never saw (another seed)."""
    held = with_sessions(generate_lines(600, seed=seed + 100), seed=seed + 100)
    return copy_check(Detector.load(model, false_alarm_rate=false_alarm_rate), held)


# -- restore ------------------------------------------------------------------------------------


async def restore_bench(
    broker: KafkaBroker, model: Path, streams: int, window: int, topic: str = "logs"
) -> dict[str, Any]:
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topics=[topic])
    state = StateSettings(changelog_topic=f"{topic}-changelog", changelog_partitions=1)
    # the states' input partition holds a line: a record's offset must be within what it holds
    await create_topic(broker.bootstrap, topic, 1)
    await produce(broker.bootstrap, topic, [(None, b"a line")])
    changelog = Changelog(kafka, state, [topic])
    await changelog.start()
    detector = Detector.load(model, window=window)
    rng = np.random.default_rng(0)
    vocab = detector.tokenizer.vocab_size
    source = f"{topic}/0"
    states = [
        StreamState(
            f"s{i}", detector.model_id, source, 1, 100, float(i), rng.integers(3, vocab, window).tolist()
        )
        for i in range(streams)
    ]
    record_bytes = len(states[0].encode())
    for start in range(0, streams, 500):
        assert await changelog.write(states[start : start + 500], {})
    try:
        started = time.perf_counter()
        read = await changelog.read({source}, detector.model_id, vocab)
        read_s = time.perf_counter() - started
    finally:
        await changelog.stop()
    started = time.perf_counter()
    StreamBook(state, 10 * streams).restore(detector, read)  # serve's engine: 64 re-encoded
    serve_restore_s = time.perf_counter() - started
    sample = read[: detector.engine.max_streams]
    started = time.perf_counter()
    detector.engine.rebuild({s.stream: s.tokens for s in sample})
    per_stream_s = (time.perf_counter() - started) / len(sample)
    return {
        "streams": streams,
        "read_states": len(read),
        "window": window,
        "record_bytes": record_bytes,
        "read_s": round(read_s, 3),
        "serve_restore_s": round(serve_restore_s, 3),
        "reencode_per_stream_ms": round(1000 * per_stream_s, 2),
        "reencode_all_per_1000_s": round(1000 * per_stream_s, 2),
        "read_per_1000_s": round(1000 * read_s / streams, 3),
    }


# -- moves --------------------------------------------------------------------------------------


@dataclass
class Message:
    key: bytes
    value: bytes
    label: int
    sent: float = 0.0  # seconds from the start, once produced
    partition: int = -1
    offset: int = -1


def plan(clusters: int, lines: int, seed: int, sessions: bool) -> list[Message]:
    """`clusters` synthetic systems with every incident kind, interleaved line by line; with
    `sessions`, each stream's lines carry its session id (logstream/evaluation/synth.py `with_sessions`)."""
    logs = [
        generate_lines(lines // clusters, seed=seed + j, incidents=INCIDENT_KINDS, incident_start=0.1)
        for j in range(clusters)
    ]
    if sessions:
        logs = [with_sessions(log, seed=seed + j) for j, log in enumerate(logs)]
    out = []
    for i in range(max(len(log.lines) for log in logs)):
        for j, log in enumerate(logs):
            if i < len(log.lines):
                host = re.search(STREAM_KEY, log.lines[i]).group(1)
                out.append(Message(f"c{j}-{host}".encode(), log.lines[i].encode(), log.labels[i]))
    return out


async def produce_steadily(
    bootstrap: str, topic: str, messages: list[Message], rate: float, t0: float
) -> None:
    """Message i at t0 + i / rate (or at once when rate is 0); records partition and offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i, message in enumerate(messages):
            if rate:
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            meta = await (await producer.send(topic, message.value, key=message.key))
            if message.offset >= 0:  # a later run of the same messages must land where the first did
                assert (meta.partition, meta.offset) == (message.partition, message.offset)
            message.sent, message.partition, message.offset = (
                time.monotonic() - t0,
                meta.partition,
                meta.offset,
            )
    finally:
        await producer.stop()


class Replica:
    """A `logstream serve` subprocess with its own audit log and port."""

    def __init__(self, work: Path, name: str, broker: KafkaBroker, model: Path, topic: str, group: str,
                 changelog: str | None, min_context_lines: int, false_alarm_rate: float | None) -> None:  # fmt: skip
        self.port = free_port()
        self.audit = work / f"audit-{name}.jsonl"
        self.log = work / f"serve-{name}.log"
        config: dict[str, Any] = {
            "model": {"dir": str(model), "threads": 1, "false_alarm_rate": false_alarm_rate},
            "kafka": {
                "bootstrap_servers": broker.bootstrap, "topics": [topic], "group_id": group,
                "max_poll_records": 64, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
            },
            "sink": {"kind": "jsonl", "path": str(work / f"anomalies-{name}.jsonl")},
            "http": {"host": "127.0.0.1", "port": self.port},
            "audit_log": str(self.audit),
            "log_format": "json",
            "state": {"changelog_topic": changelog, "min_context_lines": min_context_lines},
        }  # fmt: skip
        self.config = work / f"serve-{name}.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logstream.cli", "serve", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=WAIT_S)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=WAIT_S)

    def scores(self) -> dict[tuple[int, int], tuple[float, bool]]:
        """(partition, offset) -> (score, flagged) of each line in the audit log (a line scored
        again after a kill -9 keeps its last score)."""
        out = {}
        for line in self.audit.read_text().splitlines() if self.audit.exists() else []:
            if line.endswith("}"):
                entry = json.loads(line)
                if entry["kind"] == "line":
                    where = (int(entry["source"].rsplit("/", 1)[1]), entry["offset"])
                    out[where] = (entry["score"], entry["anomaly"])
        return out

    def restores(self) -> list[float]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines() if self.log.exists() else []:
            if line.startswith("{") and "changelog_streams_restored" in line:
                out.append(json.loads(line)["seconds"])
        return out


def wait(condition: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.25)


def lag(broker: KafkaBroker, topic: str, group: str) -> int:
    ends = asyncio.run(end_offsets(broker.bootstrap, topic, range(PARTITIONS)))
    try:
        committed = asyncio.run(committed_offsets(broker.bootstrap, group))
    except Exception:  # the coordinator moving during a rebalance: no sample
        return -1
    return sum(max(end - committed.get((topic, p), 0), 0) for p, end in ends.items())


@dataclass
class RunReport:
    name: str
    incidents_found: int = 0
    incidents: int = 0
    false_alarms: int = 0
    false_alarms_after_moves: dict[str, int] = field(default_factory=dict)
    max_lag_after_moves: dict[str, int] = field(default_factory=dict)
    catch_up_s: float = 0.0
    restore_s: list[float] = field(default_factory=list)
    moves_at_s: dict[str, float] = field(default_factory=dict)
    reference_false_alarms_after_moves: dict[str, int] = field(default_factory=dict)
    score_drift_after_moves: dict[str, float] = field(default_factory=dict)
    flagged: set[tuple[int, int]] = field(default_factory=set)


Scores = dict[tuple[int, int], tuple[float, bool]]


def score_run(name: str, messages: list[Message], scores: Scores, moves: dict[str, float], window: float,
              reference: Scores | None = None) -> RunReport:  # fmt: skip
    """Incidents found and false alarms; per move, those among lines produced in the `window`
    seconds after it, and (against `reference`) the mean |score - reference score| there."""
    flagged = {where for where, (_, anomaly) in scores.items() if anomaly}
    report = RunReport(name, flagged=flagged, moves_at_s={m: round(t, 1) for m, t in moves.items()})
    for m in messages:
        hit = (m.partition, m.offset) in flagged
        report.incidents += m.label
        report.incidents_found += m.label and hit
        report.false_alarms += (not m.label) and hit
    for move, at in moves.items():
        after = [(m.partition, m.offset) for m in messages if not m.label and at <= m.sent < at + window]
        report.false_alarms_after_moves[move] = sum(1 for where in after if where in flagged)
        if reference is not None:
            drift = [abs(scores[w][0] - reference[w][0]) for w in after if w in scores and w in reference]
            report.score_drift_after_moves[move] = round(float(np.mean(drift)), 4) if drift else 0.0
    return report


# the moving runs: name -> (changelog on, state.min_context_lines or None for --policy-lines)
RUNS = {"changelog": (True, 0), "cold": (False, 0), "cold+policy": (False, None)}


def run_moves(broker: KafkaBroker, model: Path, work: Path, messages: list[Message], args: argparse.Namespace,
              name: str, reference: Scores) -> RunReport:  # fmt: skip
    changelog, min_context = RUNS[name]
    min_context = args.policy_lines if min_context is None else min_context
    tag = f"moves-{name.replace('+', '-')}-{int(time.time())}"
    topic, group = f"{tag}-logs", f"{tag}-group"
    asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
    replicas = [Replica(work, f"{tag}-{i}", broker, model, topic, group, f"{tag}-changelog" if changelog else None,
                        min_context, args.false_alarm_rate) for i in range(4)]  # fmt: skip
    replicas[0].start()
    wait(replicas[0].ready, "the first replica")
    t0 = time.monotonic()
    producer = threading.Thread(
        target=lambda: asyncio.run(produce_steadily(broker.bootstrap, topic, messages, args.rate, t0))
    )
    producer.start()
    moves: dict[str, float] = {}
    max_lag: dict[str, int] = {}
    current = None
    for share, move in SCHEDULE:
        at = share * args.seconds
        while time.monotonic() - t0 < at:
            if current is not None:
                max_lag[current] = max(max_lag[current], lag(broker, topic, group))
            time.sleep(0.5)
        moves[move], current = time.monotonic() - t0, move
        max_lag[move] = 0
        if move == "1 -> 2":
            replicas[1].start()
        elif move == "kill -9":
            replicas[1].kill()
            replicas[1].start()
        elif move == "2 -> 4":
            replicas[2].start()
            replicas[3].start()
        else:
            replicas[2].stop()
            replicas[3].stop()
    while producer.is_alive():
        max_lag[current] = max(max_lag[current], lag(broker, topic, group))
        time.sleep(0.5)
    producer.join()
    done = time.monotonic()
    wait(lambda: lag(broker, topic, group) == 0, "the replicas to catch up")
    catch_up = time.monotonic() - done
    for replica in replicas:
        replica.stop()
    scores: Scores = {}
    for replica in replicas:
        scores |= replica.scores()
    report = score_run(name, messages, scores, moves, args.window, reference)
    same_windows = score_run("reference", messages, reference, moves, args.window)
    report.reference_false_alarms_after_moves = same_windows.false_alarms_after_moves
    report.max_lag_after_moves, report.catch_up_s = max_lag, round(catch_up, 1)
    report.restore_s = [s for r in replicas for s in r.restores()]
    return report


def run_reference(
    broker: KafkaBroker, model: Path, work: Path, messages: list[Message], false_alarm_rate: float | None
) -> Scores:
    """One replica, no moves, the same messages (same keys, so the same partitions and offsets)."""
    tag = f"reference-{int(time.time())}"
    topic, group = f"{tag}-logs", f"{tag}-group"
    asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
    asyncio.run(produce_steadily(broker.bootstrap, topic, messages, 0, time.monotonic()))
    replica = Replica(work, tag, broker, model, topic, group, None, 0, false_alarm_rate).start()
    wait(lambda: lag(broker, topic, group) == 0, "the reference replica")
    replica.stop()
    return replica.scores()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    restore = sub.add_parser("restore", help="restore time per 1,000 streams")
    restore.add_argument("--streams", type=int, default=1000)
    restore.add_argument("--window", type=int, default=2048, help="L, token ids per stream")
    moves = sub.add_parser("moves", help="false alarms and lag around replica moves")
    moves.add_argument("--seconds", type=float, default=100.0, help="how long lines are produced")
    moves.add_argument("--rate", type=float, default=30.0, help="lines per second")
    moves.add_argument("--clusters", type=int, default=8, help="synthetic systems (7 streams each)")
    moves.add_argument("--window", type=float, default=10.0, help="seconds after a move counted")
    moves.add_argument("--seed", type=int, default=1)
    moves.add_argument("--false-alarm-rate", type=float, default=None, help="serve's (default: the model's)")
    moves.add_argument("--workload", choices=("sessions", "plain"), default="sessions",
                       help="sessions: streams carry session ids (synth.with_sessions); plain: generate_lines")  # fmt: skip
    moves.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="the moving runs")
    moves.add_argument(
        "--policy-lines", type=int, default=1, help="state.min_context_lines of the +policy run"
    )
    moves.add_argument("--refit-every", type=int, default=None,
                       help="serve a copy of the model with this online tail refit interval (0: none)")  # fmt: skip
    copy = sub.add_parser("copy", help="moves' copy check alone (no broker)")
    copy.add_argument("--seed", type=int, default=1)
    copy.add_argument("--false-alarm-rate", type=float, default=None, help="default: the model's")
    for p in (restore, moves, copy):
        p.add_argument(
            "--model", type=Path, default=None,
            help="a model dir (default: train one: train_model for the sessions workload, else the tests')",
        )  # fmt: skip
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="logstream-rebalance-") as tmp:
        work = Path(tmp)
        # the sessions workload needs a model trained on it; `restore` only needs a vocabulary
        sessions = args.part == "copy" or getattr(args, "workload", "") == "sessions"
        model = args.model or (train_model if sessions else train_synthetic_model)(work / "model")
        if getattr(args, "refit_every", None) is not None:
            model = with_refit_every(model, work / "model-refit", args.refit_every)
        if args.part == "copy":
            print(json.dumps(run_copy_check(model, args.seed, args.false_alarm_rate)))
            return
        broker = KafkaBroker(work / "kafka")
        broker.start()
        try:
            if args.part == "restore":
                result: dict[str, Any] = asyncio.run(restore_bench(broker, model, args.streams, args.window))
            else:
                messages = plan(args.clusters, int(args.seconds * args.rate), args.seed, sessions)
                result = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": []}
                if sessions:
                    result["copy_check"] = run_copy_check(model, args.seed, args.false_alarm_rate)
                    print(f"copy check: {result['copy_check']}")
                # the reference first: its produce fixes each message's partition and offset,
                # which the moving runs' fresh topics repeat (same keys, same order)
                reference = run_reference(broker, model, work, messages, args.false_alarm_rate)
                base = score_run("single replica, no moves", messages, reference, {}, args.window)
                result["reference"] = asdict(base) | {"flagged": len(base.flagged)}
                for name in args.runs:
                    run = run_moves(broker, model, work, messages, args, name, reference)
                    result["runs"].append(
                        asdict(run)
                        | {
                            "flagged": len(run.flagged),
                            "same_as_reference": len(run.flagged & base.flagged),
                            "only_here": len(run.flagged - base.flagged),
                            "only_in_reference": len(base.flagged - run.flagged),
                        }
                    )
                    print(
                        f"{run.name}: incidents {run.incidents_found}/{run.incidents}, false alarms "
                        f"{run.false_alarms} (reference {base.false_alarms}), after moves "
                        f"{run.false_alarms_after_moves} (reference {run.reference_false_alarms_after_moves}), "
                        f"score drift {run.score_drift_after_moves}, max lag {run.max_lag_after_moves}, "
                        f"catch-up {run.catch_up_s}s, restores {run.restore_s}"
                    )
        finally:
            broker.stop()
    print(json.dumps(result, default=list))


if __name__ == "__main__":
    main()
