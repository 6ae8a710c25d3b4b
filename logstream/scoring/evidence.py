"""Evidence: what the model says of one line, from its tokens' surprisal.

A line's surprisal is the mean of its `top_k` most surprising words, each word by its most
surprising token (top_k = 0: every word). Words, not tokens: BPE cuts a word it never saw into
several rare pieces, and one new word must not fill the whole top k. The top k, not the mean of
all: a raw log line is mostly a known header and a few words that carry its news, and a mean
over all of them dilutes the news by the line's length. Sessions of parsed templates (HDFS)
hold no such words, and there every word counts (`SESSION_TOP_K`).
"""

from __future__ import annotations

import numpy as np

LINE_TOP_K = 3  # the words whose mean surprisal is the line's: swept leave one log out (docs/quality.md)
SESSION_TOP_K = 0  # every word: a session's lines are templates, surprising in every word
EXPLAIN_TOKENS = 3  # surprising tokens kept to explain an alert


def word_units(token_nll: np.ndarray, word_starts: np.ndarray | None = None) -> np.ndarray:
    """Each word's NLL, by its most surprising token (`word_starts`: which tokens begin a
    word, `LineTokenizer.word_starts`): [words]; without word starts, the tokens: [tokens]."""
    if word_starts is None or len(token_nll) <= 1:  # a whole line as one token
        return token_nll
    return np.maximum.reduceat(token_nll, np.flatnonzero(word_starts))


def top_mean(units: np.ndarray, top_k: int) -> float:
    """Mean of the `top_k` largest units (0: all of them); 0 for none."""
    if len(units) <= 1:
        return float(units[0]) if len(units) else 0.0
    if top_k > 0:  # the largest first; a line's few words sort faster as Python floats
        units = np.array(sorted(units.tolist(), reverse=True)[:top_k], dtype=units.dtype)
    return float(units.dtype.type(float(np.add.reduce(units)) / len(units)))


def line_surprisal(token_nll: np.ndarray, word_starts: np.ndarray | None, top_k: int) -> float:
    """Nats: the mean NLL of the line's `top_k` most surprising words."""
    return top_mean(word_units(token_nll, word_starts), top_k)


def surprising_tokens(token_nll: np.ndarray) -> tuple[tuple[int, float], ...]:
    """(token position in line, NLL) of the line's most surprising tokens, most surprising first."""
    order = np.argsort(-token_nll, kind="stable")
    return tuple((int(i), float(token_nll[i])) for i in order[:EXPLAIN_TOKENS])
