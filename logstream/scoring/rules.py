"""Operator rules: an operator's verdict on a line's template, obeyed by every driver.

The verdicts live in the feedback store (`logstream.lifecycle.feedback`): "normal" (never alert on this
template; its lines join the normal sample of the online tail) and "anomaly" (always alert; its
lines stay out of the tail). Replay, tail and serve read the same store (`--feedback DB`,
`feedback.database`), so a verdict given once holds everywhere. A store that cannot be read
keeps the last rules it read (`FeedbackRules.refresh` never raises).
"""

from __future__ import annotations

from typing import Protocol


class OperatorRules(Protocol):
    """What the scorer asks of the verdicts (`feedback.FeedbackRules`)."""

    def refresh(self) -> object:
        """Re-read the store if it is due; never raises."""

    def verdict(self, template: str, stream: str) -> str | None:
        """ "normal", "anomaly" or None for a mined template of `stream`."""
