"""Why a line scored high, in the words of the original line (not BPE pieces).

The model scores the *masked* line (`normalize`: numbers, hosts, ids ... become `<NUM>`,
`<HOST>`, `<ID>`), one byte-level BPE token at a time. An explanation maps that back:

1. **Tokens to words.** A word is a run of word characters (`\\w+`, joined by `.` or `-`:
   `events_daily`, `v1.2`, `web-1`) or one mask placeholder (`<NUM>`) of the masked line. A
   token belongs to the word holding its first word character, so ` sta`, `r`, `te`, `d` are
   all `started`. A word's surprisal is the sum of its tokens' surprisal: `-ln p(word | the
   line so far and the stream's past)`, so a word split into many pieces is one number.
   Tokens without a word character (spaces, `=`, `:`, the newline that ends the line) count
   in the line score but never stand as the explanation.
2. **Masked words to original text.** Masking is replayed rule by rule with a map from each
   masked character to the original characters it stands for, so `<NUM>` shows as `2908`.
   The model never saw that value, only "a number here"; the reason says so.
3. **The stream key is not evidence.** The words where the line spells its stream's name
   (`web-1`, a host, a block id) are skipped: which stream a line belongs to is given,
   and host or block digits would otherwise dominate. When masking already hid the key
   (syslog hosts become `<HOST>`), the placeholder is skipped just the same.

Only what the model says is claimed: "1 in N" is the model's probability of that word at
that place, given the line so far and the stream's recent lines (the window), not a
frequency over the stream's history.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from logstream.text.normalize import MaskRule, clean_line, compile_rules

MAX_WORDS = 3  # words named in an explanation
MIN_WORD_NATS = 1.0  # a word below this (p > 1/e) is not surprising enough to name
RELATIVE_CUT = 0.3  # ... nor one below this share of the most surprising word
BURST_SHOWN = 2.0  # a burst (or a rare template) is named when normal lines reach it less than once in 100

_WORD = re.compile(r"<[A-Z][A-Z0-9_]*>|\w+(?:[.-]\w+)*")
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")


def odds(nats: float) -> str:
    """The N of "1 in N" for a probability of e**-nats: "2,981", or "10^12" when tiny."""
    if nats < math.log(1e6):
        return f"{math.exp(nats):,.0f}"
    return f"10^{nats / math.log(10):.0f}"


@dataclass(frozen=True)
class Word:
    """One word of the line and how surprising the model found it."""

    text: str  # as in the original line (a masked value shows its original text)
    start: int  # span in the original line
    end: int
    nats: float  # -ln p(word | context): the sum of its tokens' surprisal
    masked: str | None = None  # the placeholder the model saw instead (e.g. "<NUM>"), if any

    @property
    def chance(self) -> str:
        """The model's probability of this word here: "1 in 2,981", or "1 in 10^12" when tiny."""
        return f"1 in {odds(self.nats)}"

    @property
    def reason(self) -> str:
        if self.masked is not None:
            return f"a {self.masked} here: {self.chance} (values are masked: the model sees only the kind, not {self.text!r})"
        return f"{self.text!r} here: {self.chance}"

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "start": self.start, "end": self.end, "nats": round(self.nats, 3),
                "masked": self.masked, "reason": self.reason}  # fmt: skip


@dataclass(frozen=True)
class Explanation:
    """The surprising words of one line, and the line's template with them highlighted."""

    line: str  # the original line
    words: tuple[Word, ...]  # most surprising first; empty when no word stands out
    segments: tuple[tuple[str, bool], ...]  # the masked line, surprising words in original text (True)
    novel: bool = False  # the line's template is new to the model
    burst: float = 0.0  # -log10 p of its template's burst in the stream (`scoring.bursts`)
    rarity: float = 0.0  # -log10 p of its template's rarity among the lines so far (`scoring.rarity`)

    @property
    def template(self) -> str:
        """The line as the model saw it, the surprising words restored (plain text)."""
        return "".join(text for text, _ in self.segments)

    def compact(self, limit: int = 240, keep: int = 40) -> tuple[tuple[str, bool], ...]:
        """`segments`, but a line longer than `limit` keeps only `keep` characters on each side
        of the stretches between surprising words (the words' surroundings)."""
        if sum(len(text) for text, _ in self.segments) <= limit:
            return self.segments
        return tuple(
            (f"{text[:keep]} … {text[-keep:]}" if not hit and len(text) > 2 * keep + 10 else text, hit)
            for text, hit in self.segments
        )

    @property
    def marked(self) -> str:
        """The template with the surprising words in **bold** (Markdown)."""
        return "".join(f"**{text}**" if hit else text for text, hit in self.segments)

    @property
    def summary(self) -> str:
        """One line for a table or an alert: the words and what the model says about them."""
        parts = [w.reason for w in self.words]
        if parts:
            parts[0] = "the model's chance of " + parts[0]
        if self.novel:
            parts.append("the line's template is new to the model")
        if self.burst >= BURST_SHOWN:
            parts.append(
                f"its template comes in a burst (a rate normal lines reach once in {odds(self.burst * math.log(10))})"
            )
        if self.rarity >= BURST_SHOWN and not self.novel:
            parts.append(
                f"its template is rare: lines at most as rare are 1 in {odds(self.rarity * math.log(10))} so far"
            )
        if not parts:
            return "no single word stands out: the line's shape (punctuation, its end) is unusual"
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"template": self.marked, "words": [w.to_json() for w in self.words],
                "novel": self.novel, "burst": round(self.burst, 2), "rarity": round(self.rarity, 2),
                "summary": self.summary}  # fmt: skip


_compiled = functools.lru_cache(maxsize=8)(compile_rules)  # explanations get a model's rules again and again


def mask_with_map(rules: tuple[MaskRule, ...], line: str) -> tuple[str, list[tuple[int, int]]]:
    """`Normalizer.mask(line)` and, for each masked character, the span of `line` it stands for.

    Replays the rules in order as `Normalizer.mask` does (same regexes, same matches), so
    the masked text is identical; a placeholder's characters all map to the matched span.
    """
    text = clean_line(line)
    spans = [(i, i + 1) for i in range(len(text))]  # same length as `line`'s head: indexes agree
    for regex, replacement, literals in _compiled(rules):
        if literals and not any(literal in text for literal in literals):
            continue  # the rule cannot match here (as in `Normalizer.mask`)
        matches = list(regex.finditer(text))
        if not matches:
            continue
        out: list[str] = []
        out_spans: list[tuple[int, int]] = []
        last = 0
        for match in matches:
            start, end = match.span()
            out.append(text[last:start])
            out_spans += spans[last:start]
            new = match.expand(replacement) if "\\" in replacement else replacement  # no group refs: as is
            if end > start:
                source = (spans[start][0], spans[end - 1][1])
            else:  # an empty match stands for nothing: anchor it where it is
                at = spans[start][0] if start < len(spans) else len(line)
                source = (at, at)
            out.append(new)
            out_spans += [source] * len(new)
            last = end
        out.append(text[last:])
        out_spans += spans[last:]
        text, spans = "".join(out), out_spans
    return text, spans


def explain_line(
    line: str,
    rules: tuple[MaskRule, ...],
    masked: str,
    token_offsets: list[tuple[int, int]],
    token_nll: np.ndarray,
    stream: str = "",
    novel: bool = False,
    burst: float = 0.0,
    rarity: float = 0.0,
) -> Explanation:
    """Explain one scored line.

    line: the original line; masked: what the model saw (`Normalizer.mask(line)`);
    token_offsets: each token's character span in `masked + "\\n"`; token_nll: [T] surprisal
    (nats) of those tokens; stream: the stream's name (its words in the line are skipped).
    """
    replayed, spans = mask_with_map(rules, line)
    if replayed != masked:  # custom rules we cannot replay: explain in the masked text itself
        line, spans = masked, [(i, i + 1) for i in range(len(masked))]
    words = list(_WORD.finditer(masked))
    owner = [-1] * (len(masked) + 1)  # masked char -> index of the word holding it
    for k, m in enumerate(words):
        owner[m.start() : m.end()] = [k] * (m.end() - m.start())
    nats = [0.0] * len(words)  # a token's surprisal goes to the first word it touches
    for (start, end), nll in zip(token_offsets, token_nll.tolist(), strict=False):
        k = next((k for k in owner[start:end] if k >= 0), -1)
        if k >= 0:
            nats[k] += nll
    key_spans = _occurrences(line, stream)
    chosen: list[tuple[int, Word]] = []
    top = None  # the most surprising word's nats (the stream's own name is not a candidate)
    for k in sorted(range(len(words)), key=lambda k: -nats[k]):  # stable: ties in line order
        m = words[k]
        start, end = spans[m.start()][0], spans[m.end() - 1][1]
        if any(start < b and a < end for a, b in key_spans):
            continue  # the stream's own name: given, not evidence
        top = nats[k] if top is None else top
        if len(chosen) == MAX_WORDS or nats[k] < max(MIN_WORD_NATS, RELATIVE_CUT * top):
            break  # the rest are less surprising still
        placeholder = _PLACEHOLDER.fullmatch(m.group()) is not None and line[start:end] != m.group()
        chosen.append((k, Word(line[start:end], start, end, nats[k], m.group() if placeholder else None)))
    return Explanation(
        line=line,
        words=tuple(w for _, w in chosen),
        segments=_segments(masked, [(words[k].span(), w.text) for k, w in chosen]),
        novel=novel,
        burst=burst,
        rarity=rarity,
    )


def line_token_offsets(tokenizer: Any, masked: str) -> list[tuple[int, int]]:
    """Each token's character span in `masked + "\\n"`, for the ids `LineTokenizer.encode_lines`
    gives (an overlong line keeps its head and the newline, so do its offsets)."""
    offsets = tokenizer.hf.backend_tokenizer.encode(masked + "\n", add_special_tokens=False).offsets
    if len(offsets) > tokenizer.max_line_tokens:
        offsets = offsets[: tokenizer.max_line_tokens - 1] + offsets[-1:]
    return list(offsets)


def _occurrences(line: str, stream: str) -> list[tuple[int, int]]:
    """Spans where the line spells the stream's name as a whole token (so stream `1` of
    `worker-(\\d+)` is the `1` of `worker-1`, not every 1 in the line)."""
    if not stream or stream == "default":
        return []
    return [(m.start(), m.end()) for m in re.finditer(rf"(?<!\w){re.escape(stream)}(?!\w)", line)]


def _segments(masked: str, hits: list[tuple[tuple[int, int], str]]) -> tuple[tuple[str, bool], ...]:
    """The masked line cut at the surprising words, which show their original text."""
    out: list[tuple[str, bool]] = []
    last = 0
    for (start, end), text in sorted(hits):
        if start > last:
            out.append((masked[last:start], False))
        out.append((text, True))
        last = end
    if last < len(masked):
        out.append((masked[last:], False))
    return tuple(out)
