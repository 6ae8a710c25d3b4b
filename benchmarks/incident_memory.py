"""Incident memory: is the top past incident of the same kind, and how fast is a lookup?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/incident_memory.py [--out runs/incident_memory]
        [--only Linux,HDFS] [--steps 400] [--sizes 10000,30000,100000] [--widths 64,128,512]
        [--write docs/incident_memory.md]

Retrieval quality, on the dev suite of benchmarks/quality.py (`logstream.evaluation.injection`):
each loghub sample's first half (contaminated with its recurring kind) trains a tiny model
(cached under --out). The scored half gets PER_KIND incidents of each of the seven kinds at
seeded random places, so every kind recurs at different times: as `dev_log` writes them ("as
injected"), and with every other occurrence of a kind worded as the other style writes it
("reworded": a daemon's words, then an application's, in the log's own layout). Each incident
becomes what the memory keeps of an alert group: the templates its lines get from the
detector's miner (seeded with the model's templates, fed the whole scored half in order) and
the mean embedding of its first lines. DISTRACTORS single lines of the log are kept too, as the
false alarms a real memory holds. In log order, each incident looks up the k = 3 incidents
most like it among those kept before it, then is kept. For every incident with an earlier one
of its kind:
- precision@1: the top one is of its kind;
- precision@3: the share of the top three of its kind, out of min(3, earlier ones of its kind).
Retrievals: templates only (template_weight 1), embeddings only (0), and both, at every weight
of GRID; embeddings in the stream's context (`StreamingEngine.score_embedded` over the scored
half) and of each line alone (`LineEmbedder`, what `incidents search --model` uses). The
weight is chosen leave one log out (the best mean precision@1 over the other logs, both
scenarios, lines alone); the shipped default is the choice over all logs.

Lookup latency: `IncidentIndex.nearest` over N kept incidents (synthetic: 8-24 words each drawn
from a Zipf vocabulary of 20k words, and a random vector as wide as the tiny, small and base
models' hidden states), the median and 99th percentile of 200 single-threaded lookups, the
time to build the index, and the memory it holds (tracemalloc).

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from quality import LOGHUB, SEED, _lines  # the dev suite's logs, as benchmarks/quality.py reads them

from logstream.detector import Detector
from logstream.engine.model import load_model_dir
from logstream.evaluation.injection import FORMATS, KINDS, InjectedLog, dev_log, incident, render
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.memory.embedding import LineEmbedder, embedding_space
from logstream.memory.retrieval import IncidentIndex, incident_words, text_words
from logstream.memory.settings import IncidentMemorySettings
from logstream.memory.store import MAX_EMBEDDED, MAX_EXAMPLES, MAX_TEMPLATES, Embedding, Incident
from logstream.records import Stream
from logstream.text.patterns import seeded_miner

PER_KIND = 4  # incidents of each kind in a log's scored half
DISTRACTORS = 20  # single lines of the log kept as false alarms
VOCABULARY = 20_000  # distinct words of the synthetic incidents (latency)
WARM_UP = 20  # lookups before the timed ones
GRID = (
    0.0,
    0.25,
    0.5,
    0.75,
    0.9,
    1.0,
)  # template_weight values tried (1: templates only, 0: embeddings only)


@dataclass
class Kept:
    """One incident (or distractor) of a log, in log order."""

    kind: str | None  # None: a distractor
    templates: tuple[str, ...]
    examples: tuple[str, ...]  # the first line of each template, as a group keeps them
    in_context: np.ndarray  # [C] mean of its first lines' embeddings, each in its stream's context
    alone: np.ndarray  # [C] the same, each line embedded alone (`LineEmbedder`)


def model_for(name: str, baseline: list[str], steps: int, out: Path) -> Path:
    """The log's tiny model, trained once per baseline and step budget (cached under `out`)."""
    config = TrainConfig(preset="tiny", max_steps=steps, seed=SEED)
    key = hashlib.sha256(json.dumps([steps, baseline]).encode()).hexdigest()[:16]
    model_dir = out / name / f"model-{key}"
    if not (model_dir / "logstream.json").exists():
        started = time.time()
        save(train([Stream("default", baseline)], config), model_dir)
        print(f"  trained {name} in {time.time() - started:.0f} s", flush=True)
    return model_dir


def reworded(name: str, lines: list[str]) -> tuple[list[str], list[str | None]]:
    """The scored half (as `dev_log` cuts it) with PER_KIND incidents of each kind, every other
    occurrence of a kind worded as the other style writes it (a daemon's words, then an
    application's), in the log's own layout: (lines, each line's kind)."""
    fmt = FORMATS[name]
    styles = (fmt.style, "app" if fmt.style == "system" else "system")
    scored = lines[len(lines) // 2 :]
    rng = random.Random(f"{name}:{SEED}:reworded")
    plan = [k for k in KINDS for _ in range(PER_KIND)]
    rng.shuffle(plan)
    at = dict(zip(sorted(rng.sample(range(len(scored)), len(plan))), plan, strict=True))
    out, seen = InjectedLog(), Counter[str]()
    for i, line in enumerate(scored):
        out.add([line], 0, None)
        if (kind := at.get(i)) is not None:
            out.add(render(fmt, line, incident(kind, styles[seen[kind] % 2], rng), rng), 1, kind)
            seen[kind] += 1
    return out.lines, out.kinds


def incidents_of(
    name: str, lines: list[str], kinds: list[str | None], model_dir: Path
) -> tuple[list[Kept], str]:
    """A scored log's incidents and distractors, in log order, with their templates and both
    embeddings."""
    model, tokenizer, meta = load_model_dir(model_dir)
    detector = Detector(model, tokenizer, meta, device="cpu")
    masked = [detector.normalizer.mask(line) for line in lines]
    miner, _ = seeded_miner(meta.get("templates", []))
    templates = [miner.add(m).template for m in masked]
    _, embedded = detector.engine.score_embedded({"default": tokenizer.encode_lines(masked)})
    context = embedded["default"]  # [lines, C]: each line in the stream's context
    runs: list[tuple[str | None, int, int]] = []  # (kind, first line, end)
    for i, kind in enumerate(kinds):
        if kind is not None and runs and runs[-1][0] == kind and runs[-1][2] == i:
            runs[-1] = (kind, runs[-1][1], i + 1)
        elif kind is not None:
            runs.append((kind, i, i + 1))
    normal = [i for i, kind in enumerate(kinds) if kind is None]
    runs += [
        (None, i, i + 1) for i in random.Random(f"{name}:{SEED}:distractors").sample(normal, DISTRACTORS)
    ]
    runs.sort(key=lambda r: r[1])
    embedder = LineEmbedder(model, tokenizer, meta)
    kept = []
    for kind, a, b in runs:
        first = slice(a, min(b, a + MAX_EMBEDDED))
        by_template = {t: line for line, t in reversed(list(zip(lines[a:b], templates[a:b], strict=True)))}
        kept.append(
            Kept(
                kind, tuple(dict.fromkeys(templates[a:b]))[:MAX_TEMPLATES],
                tuple(by_template[t] for t in dict.fromkeys(templates[a:b]))[:MAX_EXAMPLES],
                context[first].mean(axis=0), embedder.embed(lines[first]).mean(axis=0),
            )
        )  # fmt: skip
    return kept, embedding_space(meta)


def retrieval(kept: list[Kept], space: str, weight: float, alone: bool) -> dict[str, float]:
    """precision@1 and @3 of each incident's lookup over the incidents kept before it."""
    settings = IncidentMemorySettings(template_weight=weight, k=3)
    index = IncidentIndex()
    at1, at3 = [], []
    for n, item in enumerate(kept):
        vector = Embedding(space, item.alone if alone else item.in_context)
        incident = Incident(str(n), first_seen=float(n), templates=item.templates, examples=item.examples,
                            embedding=vector)  # fmt: skip
        earlier = sum(1 for k in kept[:n] if k.kind == item.kind)
        if item.kind is not None and earlier:
            hits = index.nearest(incident_words(incident), vector, settings)
            kinds = [kept[int(fp)].kind for fp, *_ in hits]
            at1.append(float(kinds[:1] == [item.kind]))
            at3.append(sum(k == item.kind for k in kinds[:3]) / min(3, earlier))
        index.add(incident)
    return {"precision_at_1": float(np.mean(at1)), "precision_at_3": float(np.mean(at3)), "queries": len(at1)}


def latency(size: int, width: int, queries: int = 200) -> dict[str, float]:
    """Lookup time over `size` synthetic incidents of `width`-dim vectors (one thread, after
    WARM_UP lookups), the time to build the index, and the memory it holds (traced in a first
    build)."""
    rng = np.random.default_rng(SEED)
    zipf = 1.0 / np.arange(1, VOCABULARY + 1)
    total = size + WARM_UP + queries
    lengths = rng.integers(8, 25, total)
    drawn = rng.choice(VOCABULARY, int(lengths.sum()), p=zipf / zipf.sum())
    texts = [" ".join(f"w{i}" for i in chunk) for chunk in np.split(drawn, np.cumsum(lengths)[:-1])]
    vectors = rng.standard_normal((total, width)).astype(np.float32)

    def build() -> IncidentIndex:
        index = IncidentIndex()
        for n in range(size):
            embedding = Embedding("m", vectors[n])
            index.add(Incident(f"i{n}", first_seen=float(n), templates=(texts[n],), embedding=embedding))
        return index

    tracemalloc.start()
    traced = build()
    held = tracemalloc.get_traced_memory()[0]  # the index (a first build also interns the words)
    tracemalloc.stop()
    del traced
    started = time.perf_counter()
    index = build()
    built = time.perf_counter() - started
    settings = IncidentMemorySettings()
    times = []
    for n in range(size, total):
        query, vector = text_words([texts[n]]), Embedding("m", vectors[n])
        started = time.perf_counter()
        index.nearest(query, vector, settings)
        times.append(time.perf_counter() - started)
    times = times[WARM_UP:]
    return {
        "incidents": size, "width": width, "median_ms": 1e3 * float(np.median(times)),
        "p99_ms": 1e3 * float(np.percentile(times, 99)), "build_s": built, "index_bytes": held,
    }  # fmt: skip


Results = dict[str, dict[str, dict[str, dict[str, float]]]]  # scenario -> log -> "source@weight" -> metrics


def choose(results: Results, exclude: str | None = None) -> float:
    """The template_weight with the best mean precision@1 (then @3, then the higher weight)
    over both scenarios' logs other than `exclude`, each line embedded alone."""

    def value(weight: float) -> tuple[float, float, float]:
        rows = [
            r[f"alone@{weight}"] for by_log in results.values() for n, r in by_log.items() if n != exclude
        ]
        return (
            np.mean([r["precision_at_1"] for r in rows]),
            np.mean([r["precision_at_3"] for r in rows]),
            weight,
        )

    return max(GRID, key=value)


def rows(results: Results) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """The table's retrievals, per scenario and log: each a fixed weight and embedding source,
    and the weight chosen on the other logs."""
    shipped = choose(results)
    held_out = {n: choose(results, n) for n in next(iter(results.values()))}
    picks = {
        "templates only": lambda n: "alone@1.0",
        "embeddings only, in context": lambda n: "context@0.0",
        "embeddings only, lines alone": lambda n: "alone@0.0",
        f"both, in context (weight {shipped})": lambda n: f"context@{shipped}",
        f"both, lines alone (weight {shipped})": lambda n: f"alone@{shipped}",
        "both, lines alone (weight chosen on the other logs)": lambda n: f"alone@{held_out[n]}",
    }
    return {
        scenario: {label: {n: by_log[n][pick(n)] for n in by_log} for label, pick in picks.items()}
        for scenario, by_log in results.items()
    }


def _mean_and_worst(by_log: dict[str, float]) -> str:
    """`mean | worst (its log)`; the log is named only when some log does better."""
    worst = min(by_log, key=by_log.__getitem__)
    named = f" ({worst})" if by_log[worst] < max(by_log.values()) else ""
    return f"{np.mean(list(by_log.values())):.3f} | {by_log[worst]:.3f}{named}"


def table(results: Results, latencies: list[dict[str, float]]) -> str:
    out = ["| incidents | retrieval | precision@1 (mean) | worst log | precision@3 (mean) | worst log |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for scenario, by_label in rows(results).items():
        for label, by_log in by_label.items():
            p1 = {n: m["precision_at_1"] for n, m in by_log.items()}
            p3 = {n: m["precision_at_3"] for n, m in by_log.items()}
            out.append(f"| {scenario} | {label} | {_mean_and_worst(p1)} | {_mean_and_worst(p3)} |")
    out += ["", "| template_weight | " + " | ".join(f"{s}: precision@1 | {s}: precision@3" for s in results) + " |",
            "|---|" + "---|---|" * len(results)]  # fmt: skip
    for weight in GRID:
        cells = [
            f"{np.mean([r[f'alone@{weight}'][m] for r in by_log.values()]):.3f}"
            for by_log in results.values()
            for m in ("precision_at_1", "precision_at_3")
        ]
        out.append(f"| {weight} | " + " | ".join(cells) + " |")
    out += ["", "| kept incidents | vector width | lookup median | lookup p99 | index build | index memory |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for x in latencies:
        out.append(
            f"| {x['incidents']:,} | {x['width']} | {x['median_ms']:.2f} ms | {x['p99_ms']:.2f} ms "
            f"| {x['build_s']:.1f} s | {x['index_bytes'] / 2**20:.0f} MiB |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=LOGHUB)
    parser.add_argument("--out", type=Path, default=Path("runs/incident_memory"))
    parser.add_argument("--only", default="", help="comma-separated log names (default: all)")
    parser.add_argument("--steps", type=int, default=400, help="training steps of each log's tiny model")
    parser.add_argument("--sizes", default="10000,30000,100000", help="kept incidents for the latency rows")
    parser.add_argument("--widths", default="64,128,512", help="vector widths for the latency rows")
    parser.add_argument("--write", type=Path, help="write the tables into this markdown file")
    args = parser.parse_args()
    names = [n for n in FORMATS if not args.only or n in args.only.split(",")]
    results: Results = {"as injected": {}, "reworded": {}}
    for name in names:
        lines = _lines(name, args.data)
        log = dev_log(name, lines, SEED, per_kind=PER_KIND)
        model_dir = model_for(name, log.baseline, args.steps, args.out)
        for scenario, (scored, kinds) in {
            "as injected": (log.scored, log.kinds), "reworded": reworded(name, lines),
        }.items():  # fmt: skip
            kept, space = incidents_of(name, scored, kinds, model_dir)
            results[scenario][name] = {
                f"{source}@{weight}": retrieval(kept, space, weight, alone=source == "alone")
                for source in ("context", "alone")
                for weight in GRID
            }
            row = results[scenario][name]
            print(f"{name:12s} {scenario:12s} templates {row['alone@1.0']['precision_at_1']:.2f}"
                  f"  embeddings {row['alone@0.0']['precision_at_1']:.2f}", flush=True)  # fmt: skip
    shipped = choose(results)
    if shipped != IncidentMemorySettings().template_weight:
        print(f"  note: the data choose template_weight {shipped}, the default is "
              f"{IncidentMemorySettings().template_weight}", flush=True)  # fmt: skip
    latencies = [latency(int(s), int(w)) for w in args.widths.split(",") for s in args.sizes.split(",")]
    rendered = table(results, latencies)
    print(rendered)
    if args.write:
        write_tables(args.write, rendered)
    print(json.dumps({"template_weight": shipped, "quality": results, "latency": latencies}))


def write_tables(path: Path, rendered: str) -> None:
    """Replace the text between the page's table markers with `rendered`."""
    text = path.read_text(encoding="utf-8")
    begin, end = "<!-- tables: begin -->", "<!-- tables: end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{rendered}\n{end}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
