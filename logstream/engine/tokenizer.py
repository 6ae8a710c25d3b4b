"""Byte-level BPE trained on normalized baseline logs.

Byte-level means any input, however foreign, tokenizes without <unk>. Each log
line is encoded on its own as `line + "\\n"`, so the newline token ends every
line and a stream's tokens are the concatenation of its lines' tokens.

By default BPE merges stop at word boundaries (GPT-2's pre-tokenizer: a run of letters,
digits or other characters with its leading space), so a known word is one token and an
unseen one several rare pieces. With `merge_across_words` the whole line is one pre-token
and merges may cross spaces: a masked line the baseline repeats often becomes a single
token (HDFS: 10.3 -> 1.0 tokens a line), so the model predicts whole templates and the
engine does several times fewer steps per line (docs/benchmarks.md, "Tokens per line").
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"  # EOS = end of stream
# Masked lines whose token ids (and word starts) a LineTokenizer keeps. A log repeats most of
# its masked lines (4 in 5 of loghub's samples, 6 in 7 of the synthetic web log), so most
# lines skip BPE; the cache is emptied when full, which bounds it (a few MB) and keeps it
# exact whatever the input.
CACHED_LINES = 8192


def train_tokenizer(
    masked_lines: Iterable[str], vocab_size: int, merge_across_words: bool = False
) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    # use_regex=False: no split into words before BPE, so merges may cross spaces
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=not merge_across_words
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((line + "\n" for line in masked_lines), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


class LineTokenizer:
    """The hot-path view of a tokenizer: masked lines in, token ids per line out."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, max_line_tokens: int = 256) -> None:
        self.hf = tokenizer
        self._fast: Tokenizer = tokenizer.backend_tokenizer
        self.max_line_tokens = max_line_tokens
        self.bos_id: int = tokenizer.bos_token_id
        self.eos_id: int = tokenizer.eos_token_id
        self.vocab_size = len(tokenizer)
        texts = [self.token_text(i) for i in range(self.vocab_size)]
        self._leading_space = np.array([t[:1].isspace() for t in texts])
        self._all_space = np.array([t.isspace() for t in texts])
        self._first_class = np.array([_char_class(t[:1]) for t in texts])
        self._last_class = np.array([_char_class(t[-1:]) for t in texts])
        self._ids: dict[str, tuple[int, ...]] = {}  # masked line -> its token ids
        self._starts: dict[tuple[int, ...], np.ndarray] = {}  # token ids -> word starts, read-only

    def word_starts(self, ids: list[int]) -> np.ndarray:
        """Which tokens of a line begin a word: a pre-token of the byte-level BPE (a run of
        letters, of digits or of other characters, with its leading space), the unit that
        BPE merges never cross by default. An unseen word is cut into several rare pieces.
        With `merge_across_words` a token may hold several words; it counts as one."""
        if len(ids) == 1:  # a whole line as one token (merges across words): skip numpy's overhead
            return np.ones(1, dtype=bool)
        key = tuple(ids)
        if (starts := self._starts.get(key)) is not None:
            return starts
        ids_ = np.asarray(ids)
        starts = self._leading_space[ids_]
        class_change = self._first_class[ids_[1:]] != self._last_class[ids_[:-1]]
        starts[1:] |= class_change & ~self._all_space[ids_[:-1]]  # " drop" may be cut as " " + "drop"
        starts[:1] = True
        starts.flags.writeable = False  # shared by every line with these ids
        if len(self._starts) >= CACHED_LINES:
            self._starts.clear()
        self._starts[key] = starts
        return starts

    def encode_lines(self, masked_lines: list[str]) -> list[list[int]]:
        """Token ids of each `line + newline`; overlong lines keep their head and the newline."""
        cached = [self._ids.get(line) for line in masked_lines]
        missing = list(
            dict.fromkeys(line for line, ids in zip(masked_lines, cached, strict=True) if ids is None)
        )
        # the _fast batch call skips the character offsets, which only explanations need
        encodings = self._fast.encode_batch_fast([line + "\n" for line in missing], add_special_tokens=False)
        found = {}
        for line, enc in zip(missing, encodings, strict=True):
            ids = enc.ids
            if len(ids) > self.max_line_tokens:
                ids = ids[: self.max_line_tokens - 1] + ids[-1:]
            found[line] = tuple(ids)
        if len(self._ids) + len(found) > CACHED_LINES:
            self._ids.clear()
        self._ids.update(islice(found.items(), CACHED_LINES))
        return [
            list(found[line] if ids is None else ids) for line, ids in zip(masked_lines, cached, strict=True)
        ]

    def token_text(self, token_id: int) -> str:
        return self.hf.decode([token_id])

    def save(self, directory: Path) -> None:
        self.hf.save_pretrained(directory)

    @classmethod
    def load(cls, directory: Path) -> LineTokenizer:
        return cls(PreTrainedTokenizerFast.from_pretrained(directory))


def prompt_ids(tokenizer: LineTokenizer, prompt_lines: list[str], max_tokens: int) -> list[int]:
    """BOS + the pattern prompt's lines, whole lines only, at most `max_tokens` ids in all."""
    ids = [tokenizer.bos_id]
    for line_ids in tokenizer.encode_lines(prompt_lines):
        if len(ids) + len(line_ids) > max_tokens:
            break
        ids.extend(line_ids)
    return ids


def _char_class(char: str) -> int:
    """0 letter, 1 digit, 2 anything else (the byte-level pre-tokenizer's classes)."""
    if not char:
        return 2
    category = unicodedata.category(char)
    return 0 if category.startswith("L") else 1 if category.startswith("N") else 2
