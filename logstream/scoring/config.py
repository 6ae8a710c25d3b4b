"""How a model scores lines: the few constants, saved with the model (`logstream.json`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from logstream.scoring.bursts import HORIZON
from logstream.scoring.evidence import LINE_TOP_K
from logstream.scoring.gpd import finite_list
from logstream.scoring.levels import (
    DEFAULT_FAILURE_WORDS,
    DEFAULT_SUCCESS_WORDS,
    check_level_words,
    line_level,
)

# The constants below are among those benchmarks/quality.py sweeps leave one log out; its
# table (docs/quality.md) gives the choice over every log, these defaults where they differ
# from it, and why.
# Orders of magnitude a line's level adds to its calibrated score (a probability factor of
# 10 ** prior).
DEFAULT_LEVEL_PRIOR = {"warning": 0.0, "error": 1.5, "critical": 2.0}
# The default sensitivity: alerts above score -log10(rate).
DEFAULT_FALSE_ALARM_RATE = 3e-4
BURST_WINDOW = 8


@dataclass(frozen=True)
class ScoringConfig:
    line_top_k: int = LINE_TOP_K  # words whose surprisal makes the line's (0: every word)
    level_prior: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LEVEL_PRIOR))
    false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE  # the default sensitivity of this model
    # online refit of the line tail every N unflagged lines; 0: only on lines marked normal
    # (`gpd.VERDICT_REFIT`)
    refit_every: int = 0
    burst_window: int = BURST_WINDOW  # lines in which a template's burst is counted (`bursts`)
    failure_words: dict[str, list[str]] = field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_FAILURE_WORDS.items()}
    )
    # a failure word followed by one of these (`reporting enabled`) does not count
    success_words: list[str] = field(default_factory=lambda: list(DEFAULT_SUCCESS_WORDS))

    def __post_init__(self) -> None:
        for name in ("line_top_k", "refit_every", "burst_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name}: {value} is negative")
        if not 1 <= self.burst_window < HORIZON:
            raise ValueError(f"burst_window: {self.burst_window} is not in 1..{HORIZON - 1}")
        finite_list([self.false_alarm_rate], "false_alarm_rate")
        if not 0 < self.false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate: {self.false_alarm_rate} is not in (0, 1)")
        if not isinstance(self.level_prior, dict) or not isinstance(self.failure_words, dict):
            raise TypeError("level_prior and failure_words: expected mappings")
        finite_list(list(self.level_prior.values()), "level_prior")
        if not isinstance(self.success_words, list) or not all(
            isinstance(w, str) for w in self.success_words
        ):
            raise TypeError("success_words: expected a list of regexes")
        check_level_words(self.failure_words, self.success_words)

    def level(self, line: str) -> str | None:
        """The line's level field or failure words (`levels.line_level`)."""
        return line_level(line, self.failure_words, self.success_words)

    def prior(self, level: str | None) -> float:
        """Orders of magnitude the level adds to a calibrated score."""
        return self.level_prior.get(level or "", 0.0)
