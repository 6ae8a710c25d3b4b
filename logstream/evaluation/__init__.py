"""Evaluation against labels: metrics, the simple peers, and the labelled dev suite.

Nothing here chooses a threshold or scores a line in production: labels only evaluate.
`benchmarks/quality.py` drives it; `replay --labels` reads `metrics`.
"""
