"""From token surprisal to calibrated scores: line, stream end and session.

- Line evidence, in nats: the model's surprisal of the line (mean of its `top_k` most
  surprising words, each word by its most surprising token; top_k = 0: all of them,
  DESIGN's plain mean; the default 3 is the issue winning over DESIGN) + the severity
  prior + the novelty bonus. Words, not tokens (`line_unit`): BPE cuts a word it never
  saw into several rare pieces, so a top 3 of tokens was filled by one new word, and a
  line with one new name scored like a line of three new words (docs/quality.md).
  - severity (the level field or failure words, `severity.line_severity`): an error line
    needs 2 nats (a factor e^2 ~ 7 in probability) less surprise to score as high as a
    plain line; Datadog's log anomaly detection looks only at warn/error logs, we weigh
    them instead of filtering;
  - novelty: the line's template is new to the model (online Drain seeded with the
    training templates). Measured on the dev sets it double-counts what the model's
    surprisal already says, so its default weight is 0 (docs/quality.md);
  - repetition (the burst discount, off by default): minus log(1 + c) nats when the
    line's template occurred c times in the stream's last `repeat_window` lines
    (`patterns.RecentPatterns`). A small model does not learn to copy from its context,
    so every line of a burst of a rare pattern is as surprising to it as the first. The
    discount raised AUC-PR on every raw-log dev set, but it also hides a known line in
    the wrong place (a broken order) and a burst of a rare known line, and it shifts with
    how much history a stream has (short held-out streams repeat less than a long-running
    one), so it is a switch, not a default (docs/quality.md).
  - template centering (off by default): minus how much more surprising than the median
    held-out line this line's template usually is (`template_offsets`). A known template
    whose lines always carry a host list, a random id or a failure word that is routine
    here (`Kerberos authentication failed` on a busy login host) is then judged against
    its own usual surprise, not against all lines: what stays is the surprise beyond the
    usual, which is what a new value, a broken order or a template never seen carry.
    It raised AUC-PR on every raw-log dev set, but it also learns whatever the baseline
    repeats: an incident that recurs in the baseline, a burst of a rare known line (the
    synthetic `burst` incidents are missed with it) and HDFS lost a little (F1 0.649 ->
    0.641), so it is a switch, not a default (docs/quality.md).
- Capped evidence, a second statistic of the same tokens: the mean of the top
  `capped_top_k` (6) words, each token's NLL capped at `token_cap` x ln V nats (V: the
  vocabulary; 1.25 ln V is 1.25x a uniform guess), plus the same priors. A small model
  given text it never saw spikes a few tokens far past any useful surprise, and those
  spikes are noise: uncapped, a line of two wild tokens outranks an OOM kill of six
  unlikely words. Capped, the tail of a line is how many of its words are unlikely, and
  the severity prior orders the rest. Each statistic has its own tail, and the line's score
  is the larger of the two. A normal line passes a threshold at rate p in each tail, so at
  most 2p in either; on held-out lines the two statistics flag nearly the same lines
  (1.0-1.25x the first one's rate, docs/quality.md), so the threshold keeps its meaning.
  The uncapped one alone missed incidents on raw logs; the capped one alone lost the HDFS
  and demo incidents that are one wildly unlikely token (docs/quality.md, "Two statistics").
- Crash words: a line the model has not seen (`unseen`) whose words, not its level field,
  are critical (`severity.critical_by_words`: `Out of memory: Kill process`, `segfault`)
  scores the critical prior a second time, after the tail, as the probability factor it
  stands for: e^3 ~ 20, +1.3 in -log10 p. In the evidence the prior is worth what the tail
  makes of 3 nats where the line lands: past a bounded tail's end a whole alert, on a heavy
  tail (a log whose held-out lines are often unseen, Thunderbird's) a tenth of an order of
  magnitude, so an unseen OOM kill there scored like an unseen boot line. Such lines are
  rare in normal logs (2 lines of the 15 loghub samples' 30,000), so the false-alarm rate moves
  by at most 19x their share (docs/quality.md, "Crash words").
- End evidence: the surprisal of the end-of-stream token when a stream closes.

Score = -log10 P(a normal line's evidence is at least this high), from the tail of
held-out baseline lines (`tail.fit_tail`, no labels). That is the one unit of every
score: a threshold of 3 means one false alarm per 1,000 normal lines for any model,
chunk or stream, and the false-alarm rate is the one sensitivity knob. Session score =
the tail of held-out sessions' worst calibrated line or end score.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from logstream.errors import UserError
from logstream.severity import (
    DEFAULT_FAILURE_WORDS,
    DEFAULT_SUCCESS_WORDS,
    check_severity_words,
    critical_by_words,
    line_severity,
)
from logstream.tail import (
    MAX_OUTLIER_SHARE,
    MIN_SAMPLES,
    TailFit,
    count,
    finite_list,
    fit_tail,
    reference_sample,
)

# Priors in nats, added to the model's surprisal (docs/quality.md weighs them).
DEFAULT_SEVERITY_PRIOR = {"warning": 0.5, "error": 2.0, "critical": 3.0}
DEFAULT_NOVELTY = 0.0
# Threshold 3.5. The tail is fitted on the baseline's own period; later periods bring rare
# normal lines it never held (a reboot, a new daemon), and at 1e-3 those alerted 26-48 times
# per 1,000 lines of a clean log (docs/quality.md, "The default sensitivity").
DEFAULT_FALSE_ALARM_RATE = 3e-4
DEFAULT_LINE_TOP_K = 3
# Sessions (sequences of parsed templates, HDFS's format) score the mean of all words: a
# template holds no unmasked values for the top k to pick out, and an unexpected template is
# surprising in every word (docs/quality.md, "HDFS sessions").
SESSION_LINE_TOP_K = 0
DEFAULT_CAPPED_TOP_K = 6  # the capped statistic's words; 0: off (one statistic, the ablation)
DEFAULT_TOKEN_CAP = 1.25  # x ln V nats: the capped statistic's ceiling on one token's NLL
LINE_UNITS = ("word", "token")  # what top_k counts; models saved before stop 14 counted tokens
DEFAULT_LINE_UNIT = "word"
DEFAULT_REPEAT_WINDOW = 0  # off; 128 lines (a 2048-token context holds about 100) when on
EXPLAIN_TOKENS = 3  # surprising tokens kept to explain an alert
# ablations: "empirical" tails only (no GPD); "raw": evidence in nats, thresholded at each
# model's own held-out quantile (no common unit)
TAIL_MODELS = ("gpd", "empirical", "raw")
# template centering: a template needs this many held-out lines to get an offset, and its
# offset is shrunk by n / (n + CENTER_SHRINK) (a pseudo-count: 3 lines give 60%)
CENTER_MIN_LINES = 3
# A session is a whole incident: a baseline "with a few percent of incidents" has a few
# percent of its sessions far out, so the session tail may drop up to 5% of them (lines: 0.5%)
SESSION_OUTLIER_SHARE = 0.05
CENTER_SHRINK = 2.0


def line_units(token_nll: np.ndarray, word_starts: np.ndarray | None = None) -> np.ndarray:
    """What a line's top k counts: with `word_starts` (which tokens begin a word,
    `LineTokenizer.word_starts`) each word once, by its most surprising token's NLL, so an
    unseen word that BPE cut into five rare pieces fills one place: [words]; else [tokens]."""
    if word_starts is None or len(token_nll) <= 1:  # a whole line as one token: merges across words
        return token_nll
    return np.maximum.reduceat(token_nll, np.flatnonzero(word_starts))


def top_mean(units: np.ndarray, top_k: int) -> float:
    """Mean of the `top_k` largest units (0: all of them); 0 for none."""
    if len(units) <= 1:
        return float(units[0]) if len(units) else 0.0
    if top_k > 0:  # the largest first, as -np.sort(-units) gives them: sorting a line's few
        # words as Python floats costs a third of numpy's sort (the values are the same)
        units = np.array(sorted(units.tolist(), reverse=True)[:top_k], dtype=units.dtype)
    # units.mean() in the units' dtype, without its Python overhead (this runs twice a line)
    return float(units.dtype.type(float(np.add.reduce(units)) / len(units)))


def surprising_tokens(token_nll: np.ndarray) -> tuple[tuple[int, float], ...]:
    """(token position in line, NLL) of the line's most surprising tokens, most surprising
    first: what an alert shows (only alerts pay for it)."""
    order = np.argsort(-token_nll, kind="stable")
    return tuple((int(i), float(token_nll[i])) for i in order[:EXPLAIN_TOKENS])


@dataclass(frozen=True)
class ScoringConfig:
    """How evidence is formed and turned into the one unit. Saved with the model."""

    line_top_k: int = DEFAULT_LINE_TOP_K
    severity_prior: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SEVERITY_PRIOR))
    content_severity: bool = True  # failure words count, not only the level field
    failure_words: dict[str, list[str]] = field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_FAILURE_WORDS.items()}
    )
    # a failure word followed by one of these (`reporting enabled`) does not count
    success_words: list[str] = field(default_factory=lambda: list(DEFAULT_SUCCESS_WORDS))
    novelty: float = DEFAULT_NOVELTY  # nats added when the line's template is new to the model
    tail_model: str = "gpd"
    false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE  # the default sensitivity of this model
    refit_every: int = 500  # online refit (DSPOT-style) every N unflagged lines; 0 = never
    repeat_window: int = DEFAULT_REPEAT_WINDOW  # lines a pattern's repeats are counted over; 0 = off
    template_centering: bool = False  # judge a known template's lines against its usual surprise
    line_unit: str = DEFAULT_LINE_UNIT  # top_k over "word"s (each by its most surprising token) or "token"s
    capped_top_k: int = DEFAULT_CAPPED_TOP_K  # the capped statistic's top k; 0: off
    token_cap: float = DEFAULT_TOKEN_CAP  # x ln V: the capped statistic's ceiling on a token's NLL
    crash_words: bool = True  # an unseen line whose words are critical: the critical prior again, in score
    follow_alerts: bool = True  # an unseen line right after its source's alert alerts with it (`following`)
    follow_same_process: bool = True  # ... also without a failure word, when the alert's pid wrote it

    def __post_init__(self) -> None:
        for name, kind in (
            ("line_top_k", int), ("refit_every", int), ("repeat_window", int), ("content_severity", bool),
            ("template_centering", bool), ("capped_top_k", int), ("crash_words", bool),
            ("follow_alerts", bool), ("follow_same_process", bool),
        ):  # fmt: skip
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name}: expected {kind.__name__}, got {type(getattr(self, name)).__name__}")
        for name in ("novelty", "false_alarm_rate", "token_cap"):
            finite_list([getattr(self, name)], name)
        if not isinstance(self.severity_prior, dict) or not isinstance(self.failure_words, dict):
            raise TypeError("severity_prior and failure_words: expected mappings")
        if not isinstance(self.success_words, list) or not all(
            isinstance(w, str) for w in self.success_words
        ):
            raise TypeError("success_words: expected a list of regexes")
        finite_list(list(self.severity_prior.values()), "severity_prior")
        if self.refit_every < 0:
            raise ValueError(f"refit_every: {self.refit_every} is negative")
        if self.repeat_window is not None and (
            not isinstance(self.repeat_window, int) or self.repeat_window < 0
        ):
            raise ValueError(
                f"repeat_window: expected a non-negative integer or None, got {self.repeat_window!r}"
            )
        if self.tail_model not in TAIL_MODELS:
            raise ValueError(f"tail_model: unknown {self.tail_model!r}; expected one of {TAIL_MODELS}")
        if not 0 < self.false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate: {self.false_alarm_rate} is not in (0, 1)")
        if self.line_unit not in LINE_UNITS:
            raise ValueError(f"line_unit: unknown {self.line_unit!r}; expected one of {LINE_UNITS}")
        for name in ("line_top_k", "capped_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} is negative")
        if self.token_cap <= 0:
            raise ValueError(f"token_cap: {self.token_cap} is not positive")
        check_severity_words(self.failure_words, self.success_words)

    def severity(self, line: str) -> str | None:
        return line_severity(line, self.failure_words if self.content_severity else {}, self.success_words)

    def names_crash(self, line: str, severity: str | None) -> bool:
        """Whether the line's own words name a crash (`severity.critical_by_words`); settled by
        its severity for nearly every line. The bonus also needs the line `unseen`."""
        return (
            self.crash_words
            and self.content_severity
            and severity == "critical"
            and critical_by_words(line, self.failure_words, self.success_words)
        )

    @property
    def crash_bonus(self) -> float:
        """What crash words add to a score, in -log10 p: the critical prior as a factor e^prior."""
        return self.severity_prior.get("critical", 0.0) / math.log(10)

    def evidence(self, surprisal: float, severity: str | None, novel: bool, repeats: int = 0) -> float:
        """Surprisal plus the priors, minus the burst discount, all in nats: the raw score
        that the line tail calibrates."""
        prior = self.severity_prior.get(severity or "", 0.0) + self.novelty * novel
        return surprisal + prior - (math.log1p(repeats) if self.repeat_window else 0.0)


@dataclass(frozen=True)
class Observation:
    """What the model and the miner say of one line, before any tail."""

    surprisal: float  # nats
    severity: str | None
    novel: bool
    repeats: int = 0  # times the line's template occurred in the stream's recent lines
    template: int | None = None  # the known (training) template's cluster number; None if new
    capped: float | None = None  # nats: the capped statistic's surprisal (None: off)
    crash: bool = False  # unseen, and its words name a crash (`ScoringConfig.names_crash`)


def unseen(token_nll: np.ndarray, vocab_size: int) -> bool:
    """Whether the model is closer to a uniform guess than to knowing the line: its median
    token costs more than half of ln V (V the vocabulary; ln V is a uniform guess)."""
    return len(token_nll) > 0 and float(np.median(token_nll)) > math.log(vocab_size) / 2


@dataclass
class Calibration:
    """The tails of held-out baseline scores (no labels), and the scoring config they hold for."""

    config: ScoringConfig = field(default_factory=ScoringConfig)
    line: TailFit | None = None
    capped: TailFit | None = None  # the capped statistic's tail (config.capped_top_k > 0)
    end: TailFit | None = None  # set when the model learned stream ends
    session: TailFit | None = None  # set when the held-out data had sessions
    line_reference: list[float] = field(default_factory=list)  # sorted held-out samples
    capped_reference: list[float] = field(default_factory=list)
    end_reference: list[float] = field(default_factory=list)
    session_reference: list[float] = field(default_factory=list)
    heldout_lines: int = 0
    heldout_sessions: int = 0
    template_offsets: dict[int, float] = field(default_factory=dict)  # known template -> nats off

    def threshold(self, false_alarm_rate: float | None = None) -> float:
        """The score threshold for a false-alarm rate (default: the config's)."""
        rate = false_alarm_rate or self.config.false_alarm_rate
        if self.config.tail_model == "raw":  # ablation: each model's own held-out quantile
            return float(np.quantile(self.line_reference, 1 - rate)) if self.line_reference else math.inf
        return -math.log10(rate)

    def evidence(self, seen: Observation) -> float:
        raw = self.config.evidence(seen.surprisal, seen.severity, seen.novel, seen.repeats)
        return raw - self.template_offset(seen.template)

    def capped_evidence(self, seen: Observation) -> float | None:
        """The capped statistic plus the same priors (None when off). Template centering
        is of the first statistic only."""
        if seen.capped is None or not self.config.capped_top_k:
            return None
        return self.config.evidence(seen.capped, seen.severity, seen.novel, seen.repeats)

    def template_offset(self, template: int | None) -> float:
        """Nats off a line of this known template (template centering; 0 when off or new)."""
        if not self.config.template_centering or template is None:
            return 0.0
        return self.template_offsets.get(template, 0.0)

    def line_score(
        self,
        evidence: float,
        fit: TailFit | None = None,
        capped: float | None = None,
        capped_fit: TailFit | None = None,
        crash: bool = False,
    ) -> float:
        """The line's score from its evidence and, when both it and a capped tail exist, its
        capped evidence: the larger of the two tails' scores (`fit`, `capped_fit`: online
        refits of the calibrated tails); plus the crash bonus for a line whose words name a
        crash (`crash`, from `ScoringConfig.names_crash`)."""
        score = _tail_score(fit or self.line, self.config.tail_model, self.line_reference, evidence)
        if self.config.tail_model == "raw":  # the ablation compares nats: one statistic, no factor
            return score
        if capped is not None and self.capped is not None:
            capped_score = _tail_score(
                capped_fit or self.capped, self.config.tail_model, self.capped_reference, capped
            )
            score = max(score, capped_score)
        return score + (self.config.crash_bonus if crash else 0.0)

    def end_score(self, raw: float) -> float:
        return _tail_score(self.end, self.config.tail_model, self.end_reference, raw)

    def session_score(self, line_scores: list[float], end_score: float | None) -> float:
        """Calibrated tail of the session's worst calibrated line or end score."""
        worst = session_worst(line_scores, end_score)
        return _tail_score(self.session, self.config.tail_model, self.session_reference, worst)

    @property
    def learned_stream_ends(self) -> bool:
        return self.end is not None

    def to_json(self) -> dict:
        out = asdict(self)
        for name in FITS:
            fit = getattr(self, name)
            out[name] = fit.to_json() if fit is not None else None
        return out

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        """A saved calibration; raises ValueError/TypeError/KeyError on bad content."""
        unknown = set(data) - {*FITS, *REFERENCES, *COUNTS, "config", "template_offsets"}
        if unknown:
            raise ValueError(f"unknown calibration fields: {sorted(unknown)}")
        fits = {name: TailFit.from_json(data[name]) if data.get(name) else None for name in FITS}
        references = {name: sorted(finite_list(data.get(name, []), name)) for name in REFERENCES}
        counts = {name: count(data[name], name) for name in COUNTS}
        config = data["config"]
        if not isinstance(config, dict):
            raise TypeError(f"config: expected a mapping, got {type(config).__name__}")
        offsets = data.get("template_offsets", {})  # absent in models saved before centering
        if not isinstance(offsets, dict):
            raise TypeError(f"template_offsets: expected a mapping, got {type(offsets).__name__}")
        values = finite_list(list(offsets.values()), "template_offsets")
        template_offsets = {int(k): v for k, v in zip(offsets, values, strict=True)}  # JSON keys are text
        # saved before words counted: its tails are of tokens; before the capped statistic: one
        # tail; before success words (stop 33): its tails were fitted without them; before crash
        # words (stop 34), following alerts (stop 35) or its same-process rule (stop 36): its
        # alerts were set without them
        before = {"line_unit": "token", "capped_top_k": 0, "success_words": []}
        config = (
            before | {"crash_words": False, "follow_alerts": False, "follow_same_process": False} | config
        )
        return cls(
            config=ScoringConfig(**config), **fits, **references, **counts, template_offsets=template_offsets
        )


FITS = ("line", "capped", "end", "session")
REFERENCES = ("line_reference", "capped_reference", "end_reference", "session_reference")
COUNTS = ("heldout_lines", "heldout_sessions")


def _tail_score(fit: TailFit | None, tail_model: str, reference: list[float], raw: float) -> float:
    if fit is None or tail_model == "raw":
        return raw
    if tail_model == "empirical":  # share of held-out scores >= raw, floored at 1/(n+1)
        above = len(reference) - int(np.searchsorted(reference, raw, side="left"))
        return -math.log10((above + 1) / (len(reference) + 1))
    return fit.score(raw)


def session_worst(line_scores: list[float], end_score: float | None) -> float:
    return max([*line_scores, *([end_score] if end_score is not None else [])], default=0.0)


def _fit(
    samples: list[float],
    max_outlier_share: float = MAX_OUTLIER_SHARE,
    events: list[int | None] | None = None,
) -> tuple[TailFit | None, list[float]]:
    """A tail and its reference sample for online refits, or (None, []) with too few samples.
    Outliers dropped as bursts (more lines than the line cap allows: `fit_tail(events=...)`)
    stay out of the reference: a refit has only the scores, so it would count their lines and
    take them back."""
    if len(samples) < MIN_SAMPLES:
        return None, []
    fit = fit_tail(samples, max_outlier_share, events=events)
    if fit.outliers > max_outlier_share * fit.samples:
        samples = sorted(v for v in samples if math.isfinite(v))[: fit.samples - fit.outliers]
    return fit, reference_sample(samples)


def template_offsets(
    templates: list[int | None], evidence: list[float]
) -> tuple[dict[int, float], list[float]]:
    """Per known template, how many nats more surprising than the median held-out line its
    lines are (median over its lines, shrunk by n / (n + CENTER_SHRINK), never negative:
    a template is not made more surprising than it is); templates with fewer than
    CENTER_MIN_LINES held-out lines get none. Also each line's evidence centered by the
    offset of its template *without that line* (leave one out), so the tail is fitted on
    what scoring will see for a line it has not measured."""
    center = float(np.median(evidence)) if evidence else 0.0
    by_template: dict[int, list[float]] = {}
    for template, value in zip(templates, evidence, strict=True):
        if template is not None:
            by_template.setdefault(template, []).append(value)

    def offset(values: list[float]) -> float:
        n = len(values)
        if n < CENTER_MIN_LINES:
            return 0.0
        return max(0.0, float(np.median(values)) - center) * n / (n + CENTER_SHRINK)

    offsets = {t: offset(v) for t, v in by_template.items()}
    centered = []
    for template, value in zip(templates, evidence, strict=True):
        if template is None:
            centered.append(value)
            continue
        others = list(by_template[template])
        others.remove(value)
        centered.append(value - offset(others))
    return {t: o for t, o in offsets.items() if o > 0}, centered


def fit_calibration(config: ScoringConfig, lines: list[Observation], end_raw: list[float]) -> Calibration:
    """Fit the line and end tails on held-out lines and stream ends (the session tail: `fit_sessions`)."""
    calibration = Calibration(config=config, heldout_lines=len(lines))
    evidence = [calibration.evidence(o) for o in lines]  # no offsets yet: the raw evidence
    templates = [o.template for o in lines]
    if config.template_centering:
        calibration.template_offsets, evidence = template_offsets(templates, evidence)
    calibration.line, calibration.line_reference = _fit(evidence, events=templates)
    capped = [calibration.capped_evidence(o) for o in lines]
    if lines and None not in capped:  # on, and observed (scores given directly have none)
        calibration.capped, calibration.capped_reference = _fit(capped, events=templates)
    if calibration.line is None:
        raise UserError(
            f"calibration: {len(lines)} held-out baseline lines; at least {MIN_SAMPLES} are needed (more baseline)"
        )
    calibration.end, calibration.end_reference = _fit(end_raw)
    return calibration


def incident_sessions(config: ScoringConfig, sessions: list[list[Observation]]) -> set[int]:
    """The held-out sessions that look like whole incidents: those whose most surprising line
    a session tail of these worst lines drops as outliers (at most SESSION_OUTLIER_SHARE of
    them). Their lines and ends stay out of the line and end tails: a baseline with a few
    percent of incident sessions has a few more incident lines than the line tail's 0.5% cap
    can tell from rare normal lines, and they stretched it over every incident like them
    (docs/quality.md, "Contaminated baseline")."""
    if len(sessions) < MIN_SAMPLES:
        return set()
    evidence = Calibration(config=config).evidence  # raw: no template offsets yet
    worst = [max(map(evidence, seen), default=0.0) for seen in sessions]
    dropped = fit_tail(worst, SESSION_OUTLIER_SHARE).outliers
    return {int(k) for k in np.argsort(worst, kind="stable")[len(worst) - dropped :]}


def fit_sessions(calibration: Calibration, worst: list[float]) -> None:
    """Fit the session tail on held-out sessions' worst calibrated line/end scores."""
    calibration.session, calibration.session_reference = _fit(worst, SESSION_OUTLIER_SHARE)
    calibration.heldout_sessions = len(worst) if calibration.session else 0


def severity(score: float, threshold: float, level: str | None) -> str:
    """critical for a surprising error line or a score far past the threshold, else warning."""
    if level in ("error", "critical") or score >= threshold * 1.5:
        return "critical"
    return "warning"


# -- evaluation against labels (never used to choose a threshold) ----------------------------


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
    """Average precision: the mean precision at each positive, scores descending."""
    if labels.sum() == 0:
        return float("nan")
    order = np.argsort(-scores, kind="mergesort")
    hits = labels[order] == 1
    precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(precision_at[hits].mean())


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
