"""Tokens per line under alternative tokenizers (the default is unchanged).

    .venv/bin/python benchmarks/tokens_per_line.py [--sessions 20000]

On HDFS's masked training lines (the 80/20 split's first `--sessions` sessions; trained on
that 80%, counted on the held-out 20%), on the loghub dev logs (trained on the first half,
counted on the second) and on `cpu_speed.py`'s synthetic web log: the default byte-level BPE
(`tokenizer.WORDS`: a mask placeholder such as `<NUM>` is one word), the one before stop 37
(GPT-2's words, which cut a placeholder into three), the same with every placeholder as one
added token, larger vocabularies (more template words become single tokens), and merges
across words (`--merge-across-words`: a common line becomes one token). Engine cost per line
is about linear in tokens per line (docs/benchmarks.md, FLOPs per token). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from logstream.incidents import strip_label_column
from logstream.inputs import InputStats, read_sessions
from logstream.normalize import Normalizer
from logstream.synth import generate_lines
from logstream.tokenizer import WORDS, LineTokenizer, train_tokenizer

DATA = Path("../shared/data/hdfs/train_sessions.jsonl")
LOGHUB = Path("../shared/data/loghub")
DEV_LOGS = {"linux": "Linux_2k.log", "openssh": "OpenSSH_2k.log", "thunderbird": "Thunderbird_2k.log"}
LABEL_COLUMN = {"thunderbird"}
# GPT-2's pre-tokenizer regex (`ByteLevel(use_regex=True)`): the default's words before stop 37
GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
VARIANTS = ("words", "GPT-2 words", "GPT-2 words + placeholder tokens", "across words")


def tokens_per_line(train: list[str], test: list[str], vocab: int, variant: str) -> float:
    words = GPT2_WORDS if variant.startswith("GPT-2") else WORDS
    hf = train_tokenizer(train, vocab, merge_across_words=variant == "across words", words=words)
    if variant == "GPT-2 words + placeholder tokens":
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
    web = [normalizer.mask(line) for line in generate_lines(4000, seed=1, web_hosts=16).lines]
    sets["synthetic web log"] = web[:2000], web[2000:]
    results: dict[str, dict[str, float]] = {}
    for name, (train, test) in sets.items():
        results[name] = {
            f"bpe{vocab} {variant}": tokens_per_line(train, test, vocab, variant)
            for vocab in (512, 1024, 4096)
            for variant in VARIANTS
        }
        print(name, results[name], flush=True)
    print(json.dumps({"tokens_per_line": results}))


if __name__ == "__main__":
    main()
