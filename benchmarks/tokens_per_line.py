"""Tokens per line under alternative tokenizers (a measurement only; the default is unchanged).

    .venv/bin/python benchmarks/tokens_per_line.py [--sessions 20000]

On HDFS's masked training lines (the 80/20 split's first `--sessions` sessions; trained on
that 80%, counted on the held-out 20%): the default byte-level BPE at the small preset's
vocabulary, the same with every mask placeholder (`<IP>`, `<NUM>`, ...) as one added token,
and larger vocabularies (more template words become single tokens). Engine cost per line is
about linear in tokens per line (docs/benchmarks.md, FLOPs per token). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from logstream.inputs import InputStats, read_sessions
from logstream.normalize import Normalizer
from logstream.tokenizer import LineTokenizer, train_tokenizer

DATA = Path("../shared/data/hdfs/train_sessions.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args()
    sessions = read_sessions(args.data, InputStats())[: args.sessions]
    cut = int(len(sessions) * 0.8)
    normalizer = Normalizer()
    train = [normalizer.mask(line) for s in sessions[:cut] for line in s.lines]
    test = [normalizer.mask(line) for s in sessions[cut:] for line in s.lines]
    placeholders = sorted({rule.replacement for rule in normalizer.rules})
    results = {}
    for vocab in (1024, 2048, 4096):
        for with_placeholders in (False, True):
            hf = train_tokenizer(train, vocab)
            if with_placeholders:
                hf.add_tokens(placeholders)
            ids = LineTokenizer(hf).encode_lines(test)
            name = f"bpe{vocab}" + ("+placeholders" if with_placeholders else "")
            results[name] = round(sum(map(len, ids)) / len(ids), 2)
            print(name, results[name], flush=True)
    print(json.dumps({"lines": len(test), "tokens_per_line": results}))


if __name__ == "__main__":
    main()
