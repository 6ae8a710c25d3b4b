"""Operator feedback: "this template is normal" (or "this was a real anomaly"), stored and obeyed.

Feedback lives in a `feedback` table of the alert outbox's SQLite database (the file that
holds the silences), with who, when and why. Unlike a silence, which mutes routing, a
"normal" verdict acts at scoring time: the Detector asks `FeedbackRules.is_normal` for each
line's template and a line whose template an operator marked normal is never an anomaly
(its score is still computed and audited, so the effect is measurable). The latest verdict
per template wins, so "anomaly" after "normal" undoes it. Both verdicts are training and
evaluation data for the next model (`normal_lines`, `confirmed_templates`).

Matching is by template, token by token: a stored template covers a line's mined template
when both have the same tokens, a `<*>` on either side matching any token. Drain widens a
template (`a b c` -> `a <*> c`) as it sees variants, so a verdict on the narrow form keeps
applying to the widened one.

Replicas: each serve process re-reads the table every `refresh_seconds` (one indexed
`SELECT max(id)`, a full read only when it changed), so replicas share feedback when their
feedback database is one file they all open (a ReadWriteMany volume; `feedback.database`
in the serve settings), and a verdict given to any of them (CLI or `POST /feedback`) is in
effect everywhere within `refresh_seconds`. With a per-pod outbox (the chart's default)
feedback is per pod, like silences.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logstream.errors import UserError
from logstream.normalize import Normalizer
from logstream.patterns import PatternMiner
from logstream.rotating import rotated_files

if TYPE_CHECKING:
    from logstream.alerts.grouping import Group

VERDICTS = ("normal", "anomaly")
WILDCARD = "<*>"
MAX_CACHED = 100_000  # templates whose verdict lookup is remembered (per revision)
MAX_TEMPLATE_CHARS = 4096  # a template longer than any line we keep is a mistake, not feedback

FEEDBACK_SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    verdict TEXT NOT NULL,
    template TEXT NOT NULL,
    line TEXT NOT NULL,
    target TEXT NOT NULL,
    model TEXT NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


class FeedbackError(UserError):
    """Feedback that cannot be stored or resolved; one line naming the reason."""


@dataclass(frozen=True)
class Feedback:
    """One verdict. `template` is what scoring matches; `line` an example (training data);
    `target` what the operator pointed at (a fingerprint, path:line, topic/partition@offset)."""

    verdict: str
    template: str
    target: str = ""
    line: str = ""
    model: str = ""  # the model whose alert it answers, when known
    created_by: str = ""
    comment: str = ""
    created_at: float = 0.0
    id: int | None = None

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@contextmanager
def _sqlite_errors(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise FeedbackError(f"feedback database {path}: {exc}") from exc


class FeedbackStore:
    """The `feedback` table in one SQLite file (WAL, shared with the outbox); thread-safe."""

    def __init__(self, path: str | Path, timeout: float = 5.0) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        with _sqlite_errors(self.path):
            if self.path != ":memory:":
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise FeedbackError(
                        f"feedback database {path}: cannot create its folder: {exc.strerror}"
                    ) from None
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=timeout
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a verdict is durable when add returns
            self._db.executescript(FEEDBACK_SCHEMA)

    def add(self, feedback: Feedback, now: float | None = None) -> Feedback:
        """Store a verdict; returns it with its id and time."""
        check(feedback)
        created_at = time.time() if now is None else now
        with _sqlite_errors(self.path), self._lock:
            cursor = self._db.execute(
                "INSERT INTO feedback (verdict, template, line, target, model, created_by, comment,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (feedback.verdict, feedback.template, feedback.line, feedback.target, feedback.model,
                 feedback.created_by, feedback.comment, created_at),
            )  # fmt: skip
        return dataclasses.replace(feedback, id=cursor.lastrowid, created_at=created_at)

    def listed(self) -> list[Feedback]:
        """Every verdict, oldest first."""
        with _sqlite_errors(self.path), self._lock:
            rows = self._db.execute(
                "SELECT verdict, template, target, line, model, created_by, comment, created_at, id"
                " FROM feedback ORDER BY id"
            ).fetchall()
        return [Feedback(*row) for row in rows]

    def revision(self) -> int:
        """The newest verdict's id (0 when none): changes whenever anyone adds one."""
        with _sqlite_errors(self.path), self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM feedback").fetchone()[0])

    def incident(self, dedup_key: str) -> Group | None:
        """The alert group with this fingerprint, when this file is also the alert outbox."""
        from logstream.alerts.outbox import find_incident  # pydantic and the routes: only here

        with _sqlite_errors(self.path), self._lock:
            return find_incident(self._db, dedup_key)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def check(feedback: Feedback) -> None:
    """FeedbackError unless the verdict is known and the template says something."""
    if feedback.verdict not in VERDICTS:
        raise FeedbackError(f"verdict: {feedback.verdict!r} is not one of {', '.join(VERDICTS)}")
    tokens = feedback.template.split()
    if not tokens or all(t == WILDCARD for t in tokens):
        raise FeedbackError("template: empty or only wildcards (it would match every line)")
    if len(feedback.template) > MAX_TEMPLATE_CHARS:
        raise FeedbackError(f"template: longer than {MAX_TEMPLATE_CHARS} characters")


def covers(template: str, mined: str) -> bool:
    """Whether a stored template matches a mined one (see `_covers`)."""
    a, b = template.split(), mined.split()
    return len(a) == len(b) and _covers(a, b)


def _covers(rule: list[str], tokens: list[str]) -> bool:
    """A stored template's tokens match a mined template's (same count): each pair equal or
    one of them `<*>` (Drain may have widened either since)."""
    return all(x == y or WILDCARD in (x, y) for x, y in zip(rule, tokens, strict=True))


def latest_verdicts(feedback: list[Feedback]) -> dict[str, str]:
    """template -> its latest verdict (feedback oldest first)."""
    return {f.template: f.verdict for f in feedback}


@dataclass(frozen=True)
class _Rules:
    """One revision of the normal templates (by token count) and its lookups so far."""

    revision: int
    by_length: dict[int, list[list[str]]]
    cache: dict[str, bool]


class FeedbackRules:
    """The templates marked normal now, re-read from the store every `refresh_seconds`.

    `is_normal` runs per flagged line on the scoring thread; `refresh` may run there or on
    the HTTP thread after a POST. A refresh swaps in a whole new `_Rules` (one attribute), so
    a lookup never mixes two revisions and needs no lock.
    """

    def __init__(
        self,
        store: FeedbackStore,
        refresh_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._rules = _Rules(-1, {}, {})
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> bool:
        """Re-read the verdicts if `refresh_seconds` passed (or `force`) and any were added;
        True when the rules changed."""
        with self._lock:
            now = self.clock()
            if not force and now - self._checked_at < self.refresh_seconds:
                return False
            self._checked_at = now
            revision = self.store.revision()
            if revision == self._rules.revision:
                return False
            by_length: dict[int, list[list[str]]] = {}
            for template, verdict in latest_verdicts(self.store.listed()).items():
                if verdict == "normal":
                    tokens = template.split()
                    by_length.setdefault(len(tokens), []).append(tokens)
            self._rules = _Rules(revision, by_length, {})
            return True

    @property
    def normal_templates(self) -> int:
        return sum(len(v) for v in self._rules.by_length.values())

    def is_normal(self, mined: str) -> bool:
        """Whether an operator's latest verdict on a template covering `mined` is "normal"."""
        rules = self._rules
        hit = rules.cache.get(mined)
        if hit is None:
            tokens = mined.split()
            hit = any(_covers(rule, tokens) for rule in rules.by_length.get(len(tokens), ()))
            if len(rules.cache) < MAX_CACHED:  # bounded: hostile input mints templates without end
                rules.cache[mined] = hit
        return hit


# -- what an operator points at -> a template ------------------------------------------


def template_of(line: str, normalizer: Normalizer) -> str:
    """The template the detector's miner gives a line the first time it sees its pattern."""
    return PatternMiner().add(normalizer.mask(line)).template


def line_at(path: Path, number: int) -> str:
    """Line `number` (1-based, as alerts show `path:line`) of a file; FeedbackError if absent."""
    if number < 1:
        raise FeedbackError(f"{path}:{number}: lines are numbered from 1")
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if i == number:
                    return line.rstrip("\r\n")
    except OSError as exc:
        raise FeedbackError(f"{path}: cannot read: {exc.strerror}") from None
    raise FeedbackError(f"{path} has fewer than {number} lines")


def audit_entries(audit_log: Path) -> Iterator[dict]:
    """The serve audit log's entries, oldest first: its rotated files (`audit_log.n` ...
    `audit_log.1`), then `audit_log`; a torn line (after a crash) is skipped."""
    files = rotated_files(audit_log)
    if not files:
        raise FeedbackError(f"audit log {audit_log}: cannot read: No such file or directory")
    for path in files:
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                for text in f:
                    try:
                        entry = json.loads(text)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(entry, dict):
                        yield entry
        except FileNotFoundError:
            continue  # serve rotated it on since the listing: a later read has its lines
        except OSError as exc:
            raise FeedbackError(f"audit log {path}: cannot read: {exc.strerror}") from None


def audit_entry(audit_log: Path, location: str) -> dict[str, object]:
    """The serve audit log's entry for `topic/partition@offset` (the newest, if re-delivered)."""
    source, _, offset = location.rpartition("@")
    if not source or not offset.isdigit():
        raise FeedbackError(f"{location!r}: expected topic/partition@offset or path:line")
    found: dict[str, object] | None = None
    for entry in audit_entries(audit_log):
        if entry.get("source") == source and entry.get("offset") == int(offset):
            found = entry
    if found is None or not found.get("template"):
        raise FeedbackError(f"{location}: not in the audit log {audit_log} (or logged without its template)")
    return found


@dataclass(frozen=True)
class Target:
    """What an operator points at; exactly one is set. `at` is `path:line` (read from the
    file) or `topic/partition@offset` (looked up in serve's audit log)."""

    template: str | None = None
    line: str | None = None
    fingerprint: str | None = None
    at: str | None = None

    def describe(self) -> str:
        given = [(k, v) for k, v in vars(self).items() if v is not None]
        if len(given) != 1:
            raise FeedbackError("give exactly one of template, line, fingerprint, at")
        return f"{given[0][0]}:{given[0][1]}"


def resolve(
    verdict: str,
    target: Target,
    store: FeedbackStore,
    *,
    normalizer: Normalizer | None = None,
    audit_log: Path | None = None,
    created_by: str = "",
    comment: str = "",
) -> Feedback:
    """The Feedback for a target: its template, an example line and the model when known.
    A raw line (given, or read from `path:line`) needs the model's `normalizer` to become a
    template; a fingerprint is looked up in the outbox's alert groups."""
    described = target.describe()
    template, line, model = target.template, target.line or "", ""
    if target.fingerprint is not None:
        group = store.incident(target.fingerprint)
        if group is None:
            raise FeedbackError(f"fingerprint {target.fingerprint}: no such alert in {store.path}")
        template, line, model = group.template_text, group.first_line, group.model_id
    elif target.at is not None:
        path, _, number = target.at.rpartition(":")
        if path and number.isdigit() and "@" not in number:
            line = line_at(Path(path), int(number))
        elif audit_log is None:
            raise FeedbackError(f"{target.at}: a Kafka location needs the serve audit log (--audit)")
        else:
            entry = audit_entry(audit_log, target.at)
            template, model = str(entry["template"]), str(entry.get("model", ""))
    if template is None:
        if normalizer is None:
            raise FeedbackError(f"{described}: a raw line needs the model (--model) to find its template")
        template = template_of(line, normalizer)
    feedback = Feedback(verdict, template, described, line, model, created_by, comment)
    check(feedback)  # before anyone stores it: the HTTP endpoint answers 400 with the reason
    return feedback
