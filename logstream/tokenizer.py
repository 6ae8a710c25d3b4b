"""Byte-level BPE trained on normalized baseline logs.

Byte-level means any input, however foreign, tokenizes without <unk>. Each log
line is encoded on its own as `line + "\\n"`, so the newline token ends every
line and a stream's tokens are the concatenation of its lines' tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"  # EOS = end of stream


def train_tokenizer(masked_lines: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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

    def encode_lines(self, masked_lines: list[str]) -> list[list[int]]:
        """Token ids of each `line + newline`; overlong lines keep their head and the newline."""
        encodings = self._fast.encode_batch([line + "\n" for line in masked_lines], add_special_tokens=False)
        out = []
        for enc in encodings:
            ids = enc.ids
            if len(ids) > self.max_line_tokens:
                ids = ids[: self.max_line_tokens - 1] + ids[-1:]
            out.append(ids)
        return out

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
