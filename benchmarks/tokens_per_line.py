"""Tokens per line under alternative tokenizers (the default is unchanged).

    .venv/bin/python benchmarks/tokens_per_line.py [--sessions 20000]

On HDFS's masked training lines (the 80/20 split's first `--sessions` sessions; trained on
that 80%, counted on the held-out 20%) and on the loghub dev logs (trained on the first
half, counted on the second): the default byte-level BPE, the same with every mask
placeholder (`<IP>`, `<NUM>`, ...) as one added token, larger vocabularies (more template
words become single tokens), and merges across words (`--merge-across-words`: a common line
becomes one token). Engine cost per line is about linear in tokens per line
(docs/benchmarks.md, FLOPs per token). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from logstream.consumers.inputs import InputStats, read_sessions
from logstream.engine.tokenizer import LineTokenizer, train_tokenizer
from logstream.evaluation.injection import strip_label_column
from logstream.text.normalize import Normalizer

DATA = Path("../shared/data/hdfs/train_sessions.jsonl")
LOGHUB = Path("../shared/data/loghub")
DEV_LOGS = {"linux": "Linux_2k.log", "openssh": "OpenSSH_2k.log", "thunderbird": "Thunderbird_2k.log"}
LABEL_COLUMN = {"thunderbird"}


def tokens_per_line(train: list[str], test: list[str], vocab: int, variant: str) -> float:
    hf = train_tokenizer(train, vocab, merge_across_words=variant == "across words")
    if variant == "placeholders":
        hf.add_tokens(sorted({rule.replacement for rule in Normalizer().rules}))
    ids = LineTokenizer(hf).encode_lines(test)
    return round(sum(map(len, ids)) / len(ids), 2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--loghub", type=Path, default=LOGHUB)
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args()
    normalizer = Normalizer()
    sessions = read_sessions(args.data, InputStats())[: args.sessions]
    cut = int(len(sessions) * 0.8)
    sets = {
        "hdfs": (
            [normalizer.mask(line) for s in sessions[:cut] for line in s.lines],
            [normalizer.mask(line) for s in sessions[cut:] for line in s.lines],
        )
    }
    for name, file in DEV_LOGS.items():
        raw = (args.loghub / file).read_text(encoding="utf-8", errors="replace").splitlines()
        lines = [normalizer.mask(strip_label_column(x) if name in LABEL_COLUMN else x) for x in raw]
        sets[name] = lines[: len(lines) // 2], lines[len(lines) // 2 :]
    results: dict[str, dict[str, float]] = {}
    for name, (train, test) in sets.items():
        results[name] = {
            f"bpe{vocab} {variant}": tokens_per_line(train, test, vocab, variant)
            for vocab in (512, 1024, 4096)
            for variant in ("words", "placeholders", "across words")
        }
        print(name, results[name], flush=True)
    print(json.dumps({"tokens_per_line": results}))


if __name__ == "__main__":
    main()
