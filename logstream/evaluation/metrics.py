"""Detection metrics against labels (never used to choose a threshold)."""

from __future__ import annotations

import numpy as np


def precision_recall_f1(
    scores: np.ndarray, labels: np.ndarray, threshold: float
) -> tuple[float, float, float]:
    predicted = scores > threshold
    tp = int((predicted & (labels == 1)).sum())
    fp = int((predicted & (labels == 0)).sum())
    fn = int((~predicted & (labels == 1)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def auc_roc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a random positive outscores a random negative (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    ranks = _average_ranks(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def auc_pr(scores: np.ndarray, labels: np.ndarray) -> float:
    """Average precision: the mean precision at each positive, scores descending. Tied scores
    share one precision (the tie's, counted once), so an order inside a tie earns nothing."""
    if labels.sum() == 0:
        return float("nan")
    order = np.argsort(-scores, kind="mergesort")
    s, hits = scores[order], labels[order] == 1
    last = np.r_[s[1:] != s[:-1], True]  # the last row of each run of equal scores
    tp = np.cumsum(hits)[last]
    flagged = np.arange(1, len(s) + 1)[last]
    new_tp = np.diff(np.r_[0, tp])
    return float((new_tp * tp / flagged).sum() / labels.sum())


def best_f1(scores: np.ndarray, labels: np.ndarray) -> float:
    """The F1 of the best threshold in hindsight: an oracle, for reference only."""
    if labels.sum() == 0:
        return 0.0
    order = np.argsort(-scores, kind="mergesort")
    hits = labels[order] == 1
    tp, flagged = np.cumsum(hits), np.arange(1, len(hits) + 1)
    cut = np.r_[scores[order][1:] != scores[order][:-1], True]  # a threshold between distinct scores
    f1 = 2 * tp / (flagged + labels.sum())
    return float(f1[cut].max())


def false_alarms_per_1000(flagged: np.ndarray, labels: np.ndarray) -> float:
    negatives = int((labels == 0).sum())
    return 1000 * int((flagged & (labels == 0)).sum()) / negatives if negatives else 0.0
