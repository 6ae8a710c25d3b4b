"""Operator feedback: "this template is normal" (or "this was a real anomaly"), stored and obeyed.

Feedback lives in a `feedback` table of the alert outbox's SQLite database (the file that
holds the silences), with who (the authenticated user and the address the verdict came
from), when and why. Unlike a silence, which mutes routing, a verdict acts at scoring time:
the scorer asks `FeedbackRules.verdict(template, stream)` for each line's template and a
line an operator marked normal is not an anomaly (its score is still computed and audited,
so the effect is measurable). Both verdicts are training and evaluation data for the next
model (`effective`, `latest_verdicts`).

A rule is a template, a stream glob (its scope, `*` for every stream) and, optionally, an
expiry time. Matching is by template, token by token: a rule covers a line's mined template
when both have the same tokens, a `<*>` on either side matching any token, and the literal
text they share is at least half of it (below). Drain widens a template (`a b c` -> `a <*>
c`) as it sees variants, so a verdict on the narrow form keeps applying to the widened one,
as long as the widened one still says what its lines are about.

A rule must say what it is about: at least half of its tokens literal text (`check`). Masks
(`<*>`, `<TS>`, `<NUM>`, ... whatever a mask rule writes) are not text, and the masked header
every line of a format opens with (`<TS> <HOST>`) counts as one token, as the miner counts
it. Half is the miner's own bar (`PatternMiner` similarity 0.5): a line joins a template
when at least half of its tokens equal the template's, so a rule with less literal text is
broader than any template the miner forms and would cover lines of many (`<TS> <*> <*>`
covers every three-token line).

Precedence: for one template and scope the newest verdict not expired is in force ("anomaly"
after "normal" undoes it; when a temporary verdict expires, the one before it is back).
Among the rules in force covering a line the most specific wins: more literal text shared
with the line's mined template, then a narrower stream glob (more literal characters); on a
tie "anomaly" beats "normal". So a confirmed anomaly overrides any broader "normal" rule.

Replicas: every process reads the table every `refresh_seconds` through a connection of its
own (a cheap `max(id), count(*)`, a full read only when it changed). SQLite's locks work
only between processes on one host: never share one file between pods over a network
volume (docs/lifecycle.md says what to do instead). Retention: `FeedbackStore.prune` drops
verdicts expired, and verdicts superseded for good, more than `retention_days` ago.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import structlog

from logstream.errors import UserError
from logstream.metrics import FEEDBACK_REFRESH_ERRORS, FEEDBACK_RULES
from logstream.rotating import rotated_files
from logstream.text.normalize import Normalizer
from logstream.text.patterns import PatternMiner, split_tokens

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

VERDICTS = ("normal", "anomaly")
WILDCARD = "<*>"
EVERY_STREAM = "*"
# A mask as the normalizer writes it (`<TS>`, `<NUM>`, any rule's `<NAME>`) or Drain's `<*>`.
MASK = re.compile(r"<(?:[A-Z][A-Z0-9_]*|\*)>")
MAX_CACHED = 100_000  # templates whose covering rules are remembered (per revision)
MAX_TEMPLATE_CHARS = 4096  # a template longer than any line we keep is a mistake, not feedback
MAX_STREAM_CHARS = 256
# Scoring reads the rules; it never waits longer than this on a lock (a writer holds one for
# milliseconds; anything longer is an outage, and the rules it has stay in force).
READ_TIMEOUT_SECONDS = 0.1

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
# Columns added to the first schema: (name, declaration); an older table gains them on open.
ADDED_COLUMNS = (
    ("stream", "TEXT NOT NULL DEFAULT '*'"),
    ("expires_at", "REAL"),
    ("remote", "TEXT NOT NULL DEFAULT ''"),
)
COLUMNS = (
    "verdict, template, target, line, model, created_by, comment, created_at, id, stream, expires_at, remote"
)


class FeedbackError(UserError):
    """Feedback that cannot be stored or resolved; one line naming the reason."""


class FeedbackUnavailable(FeedbackError):
    """The feedback database cannot be used right now (locked, damaged, gone): retry later."""


@dataclass(frozen=True)
class Feedback:
    """One verdict. `template` is what scoring matches, `stream` the glob of streams it
    applies to, `expires_at` when it stops (unix seconds; None: never); `line` an example
    (training data); `target` what the operator pointed at (a fingerprint, path:line,
    topic/partition@offset); `created_by` the authenticated user, `remote` where from."""

    verdict: str
    template: str
    target: str = ""
    line: str = ""
    model: str = ""  # the model whose alert it answers, when known
    created_by: str = ""
    comment: str = ""
    created_at: float = 0.0
    id: int | None = None
    stream: str = EVERY_STREAM
    expires_at: float | None = None
    remote: str = ""

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def in_force(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


@contextmanager
def _sqlite_errors(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise FeedbackUnavailable(f"feedback database {path}: {exc}") from exc


class FeedbackStore:
    """The `feedback` table in one SQLite file (WAL, shared with the outbox); thread-safe.
    This is the writer's side; scoring reads through `FeedbackRules`.

    Each operation opens a connection of its own and closes it: between operations the
    store holds no lock and no file, so a replaced file is used as it is now, and another
    process may take the database for a while (a backup, an exclusive lock), during which
    operations fail after `timeout` seconds with a FeedbackError and scoring goes on."""

    def __init__(self, path: str | Path, timeout: float = 5.0) -> None:
        self.path = str(path)
        self.timeout = timeout
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FeedbackError(
                f"feedback database {path}: cannot create its folder: {exc.strerror}"
            ) from None
        self._schema = False
        try:
            self._ensure_schema()
        except FeedbackUnavailable as exc:  # held by another process (a backup): serve starts anyway
            log.warning("feedback_database_unavailable_at_start", database=self.path, error=str(exc))

    def _ensure_schema(self) -> None:
        """The table, its added columns and index, once (each write asks: a database that was
        locked at start gets them at its first write; `FeedbackRules` reads a missing table
        as no verdicts)."""
        if self._schema:
            return
        with self.connection() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(FEEDBACK_SCHEMA)
            have = {row[1] for row in db.execute("PRAGMA table_info(feedback)")}
            for name, declaration in ADDED_COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE feedback ADD COLUMN {name} {declaration}")
            db.execute("CREATE INDEX IF NOT EXISTS feedback_rule ON feedback (template, stream)")
        self._schema = True

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[sqlite3.Connection]:
        """A connection of its own, waiting at most `timeout` (default the store's) for a lock."""
        with _sqlite_errors(self.path):
            db = sqlite3.connect(
                self.path, isolation_level=None, timeout=self.timeout if timeout is None else timeout
            )
            try:
                db.execute("PRAGMA synchronous=FULL")  # a verdict is durable when add returns
                yield db
            finally:
                db.close()

    def add(self, feedback: Feedback, now: float | None = None) -> Feedback:
        """Store a verdict; returns it with its id and time."""
        created_at = time.time() if now is None else now
        check(feedback, created_at)
        self._ensure_schema()
        with self.connection() as db:
            cursor = db.execute(
                "INSERT INTO feedback (verdict, template, line, target, model, created_by, comment,"
                " created_at, stream, expires_at, remote) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (feedback.verdict, feedback.template, feedback.line, feedback.target, feedback.model,
                 feedback.created_by, feedback.comment, created_at, feedback.stream, feedback.expires_at,
                 feedback.remote),
            )  # fmt: skip
        return dataclasses.replace(feedback, id=cursor.lastrowid, created_at=created_at)

    def listed(self, timeout: float | None = None) -> list[Feedback]:
        """Every verdict, oldest first; `timeout`: the read's wait for a lock, if not the store's."""
        self._ensure_schema()
        with self.connection(timeout) as db:
            return [Feedback(*row) for row in db.execute(f"SELECT {COLUMNS} FROM feedback ORDER BY id")]

    def prune(self, retention_days: float, now: float | None = None) -> int:
        """Drop verdicts that expired, and verdicts a newer one on the same template and scope
        replaced for good (it lasts at least as long), more than `retention_days` ago; the
        number dropped. What is in force, or may be again, stays."""
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        self._ensure_schema()
        with self.connection() as db:
            return db.execute(
                "DELETE FROM feedback WHERE (expires_at IS NOT NULL AND expires_at < :cutoff)"
                " OR EXISTS (SELECT 1 FROM feedback AS newer WHERE newer.template = feedback.template"
                " AND newer.stream = feedback.stream AND newer.id > feedback.id"
                " AND newer.created_at < :cutoff AND (newer.expires_at IS NULL"
                " OR (feedback.expires_at IS NOT NULL AND newer.expires_at >= feedback.expires_at)))",
                {"cutoff": cutoff},
            ).rowcount

    def close(self) -> None:
        """Nothing to release (no operation keeps a connection); callers may still scope the
        store with it."""


# -- what a rule says and covers ----------------------------------------------------------


def literal_share(template: str) -> tuple[int, int]:
    """(literal tokens, tokens) of a template as the miner counts them: a token is literal
    when it holds a letter or digit outside its masks; the leading run of masks (the
    header, `<TS> <HOST>`) counts as one token."""
    tokens = split_tokens(template)
    header = _header(tokens, tokens)
    return sum(map(_is_literal, tokens[header:])), len(tokens) - header + (header > 0)


def _header(a: Sequence[str], b: Sequence[str]) -> int:
    """How many leading tokens both open with that are the same mask (not `<*>`)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n] and a[n] != WILDCARD and MASK.fullmatch(a[n]):
        n += 1
    return n


def _is_literal(token: str) -> bool:
    return any(c.isalnum() for c in MASK.sub("", token))


def check(feedback: Feedback, now: float | None = None) -> None:
    """FeedbackError unless the verdict is known, the template says what it is about (at
    least half of it literal text: see the module docstring), the scope is a glob and the
    expiry, if any, is after `now`."""
    if feedback.verdict not in VERDICTS:
        raise FeedbackError(f"verdict: {feedback.verdict!r} is not one of {', '.join(VERDICTS)}")
    if not isinstance(feedback.template, str) or not isinstance(feedback.stream, str):
        raise FeedbackError("template and stream: text expected")
    if feedback.expires_at is not None and not isinstance(feedback.expires_at, int | float):
        raise FeedbackError("expires: a time expected")
    if len(feedback.template) > MAX_TEMPLATE_CHARS:
        raise FeedbackError(f"template: longer than {MAX_TEMPLATE_CHARS} characters")
    literal, tokens = literal_share(feedback.template)
    if not literal or 2 * literal < tokens:
        raise FeedbackError(
            f"template: {literal} of its {tokens} tokens are literal text (masks such as <*>, <TS>, <NUM>"
            " are not, and the leading ones count as one token); a rule needs at least half, or it"
            " covers lines of many templates"
        )
    stream = feedback.stream
    if not stream or len(stream) > MAX_STREAM_CHARS or not stream.isprintable() or stream != stream.strip():
        raise FeedbackError(f"stream: {stream!r} is not a stream glob (e.g. * or checkout-*)")
    if feedback.expires_at is not None and now is not None and feedback.expires_at <= now:
        raise FeedbackError("expires: the time is already past")


def valid(feedback: Feedback) -> bool:
    """Whether a stored verdict passes `check` (rows written before a rule existed may not)."""
    try:
        check(feedback)
    except FeedbackError:
        return False
    return True


def covers(template: str, mined: str) -> bool:
    """Whether a stored template matches a mined one (see `shared_text`)."""
    return shared_text(split_tokens(template), split_tokens(mined)) > 0


def shared_text(rule: Sequence[str], tokens: Sequence[str]) -> int:
    """The literal tokens a stored template shares with a mined one when it covers it, else 0.

    It covers it when both have as many tokens, each pair equal or one of them `<*>` (Drain
    may have widened either since), and the literal text they share is at least half of the
    tokens, as `check` asks of a rule (the masked header they open with counts as one): a
    rule's text where the mined template has `<*>` says nothing about that template's lines,
    so a detailed rule never covers a template too broad to mark."""
    if len(rule) != len(tokens):
        return 0
    header = _header(rule, tokens)
    shared = 0
    for x, y in zip(rule[header:], tokens[header:], strict=True):
        if x == y:
            shared += _is_literal(x)
        elif WILDCARD not in (x, y):
            return 0
    return shared if shared and 2 * shared >= len(rule) - header + (header > 0) else 0


def scope_rank(glob: str) -> int:
    """How narrow a stream glob is: its literal characters (`*` 0, `db-*` 3, `db-1` 4)."""
    return len(re.sub(r"\[[^\]]*\]|[*?]", "", glob))


def effective(feedback: Iterable[Feedback], now: float | None = None) -> list[Feedback]:
    """The rules in force at `now` (oldest first in, one per template and stream glob out):
    for each, its newest verdict that has not expired; verdicts failing `check` never are."""
    at = time.time() if now is None else now
    newest: dict[tuple[str, str], Feedback] = {}
    for f in feedback:
        if valid(f) and f.in_force(at):
            newest[(f.template, f.stream)] = f
    return list(newest.values())


def latest_verdicts(feedback: Iterable[Feedback], now: float | None = None) -> dict[str, str]:
    """template -> its verdict in force (feedback oldest first), whatever the scope; a
    template with both verdicts in force (in different scopes) is an anomaly."""
    out: dict[str, str] = {}
    for f in effective(feedback, now):
        out[f.template] = "anomaly" if "anomaly" in (f.verdict, out.get(f.template)) else f.verdict
    return out


# -- scoring's view -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """One template and scope: its valid verdicts, newest first."""

    tokens: tuple[str, ...]
    stream: str
    history: tuple[Feedback, ...]

    def in_force(self, now: float) -> Feedback | None:
        return next((f for f in self.history if f.in_force(now)), None)


# How specific a rule is for one mined template: the literal text they share, then the
# literal characters of its stream glob. Compared per mined template, so a detailed rule is
# no more specific than the template it covers lets it be.
Rank = tuple[int, int]


@dataclass(frozen=True)
class _Rules:
    """One revision of the rules (by token count) and its lookups so far: mined template ->
    the rules covering it, most specific first."""

    revision: tuple[int, int]
    by_length: dict[int, list[_Rule]]
    cache: dict[str, tuple[tuple[Rank, _Rule], ...]]


def _compile(rows: list[Feedback], revision: tuple[int, int]) -> _Rules:
    histories: dict[tuple[str, str], list[Feedback]] = {}
    for f in rows:  # oldest first
        histories.setdefault((f.template, f.stream), []).insert(0, f)
    by_length: dict[int, list[_Rule]] = {}
    for (template, stream), history in histories.items():
        tokens = tuple(split_tokens(template))
        by_length.setdefault(len(tokens), []).append(_Rule(tokens, stream, tuple(history)))
    return _Rules(revision, by_length, {})


class FeedbackRules:
    """The rules in force, re-read from the store's file every `refresh_seconds`.

    `verdict` runs per line on the scoring thread; `refresh` runs there (once a batch) or on
    the HTTP thread after a POST. A refresh swaps in a whole new `_Rules` (one attribute), so
    a lookup never mixes two revisions and needs no lock.

    `refresh` never raises: a database that is locked, unreadable, damaged or gone keeps the
    last rules read in force, counts the error (`logstream_feedback_refresh_errors_total
    {kind}`), logs it once per kind until a read succeeds again, and is tried again at the
    next refresh. Reads open a connection of their own each time (so a replaced file or a
    lock taken since are seen) that waits at most READ_TIMEOUT_SECONDS for a lock and never
    creates the file; `store` is the writer's and only names the file.
    """

    def __init__(
        self,
        store: FeedbackStore,
        refresh_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = store.path
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._rules = _Rules((-1, -1), {}, {})
        self._failing: set[str] = set()  # error kinds logged since the last good read
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> bool:
        """Re-read the verdicts if `refresh_seconds` passed (or `force`) and any changed;
        True when the rules changed. Never raises, never waits on another refresh."""
        if not self._lock.acquire(blocking=False):
            return False  # another thread is reading them right now
        try:
            now = self.clock()
            if not force and now - self._checked_at < self.refresh_seconds:
                return False
            self._checked_at = now
            try:
                rules = self._read()
            except sqlite3.Error as exc:
                name = getattr(exc, "sqlite_errorname", "") or "SQLITE_UNKNOWN"
                self._failed(name.split("_")[1].lower(), exc)  # BUSY, NOTADB, IOERR_READ: the class
                return False
            except Exception as exc:  # a row no check foresaw: scoring must go on all the same
                self._failed("unexpected", exc)
                return False
            if self._failing:
                log.info("feedback_refresh_recovered", database=self.path, kinds=sorted(self._failing))
                self._failing.clear()
            if rules is None:
                return False
            self._rules = rules
            in_force = self.effective()
            for verdict in VERDICTS:
                FEEDBACK_RULES.labels(verdict=verdict).set(sum(f.verdict == verdict for f in in_force))
            return True
        finally:
            self._lock.release()

    def _read(self) -> _Rules | None:
        """The rules in the file now; None when unchanged since the last read."""
        uri = "file:" + quote(Path(self.path).absolute().as_posix()) + "?mode=rw"  # never create it
        db = sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT_SECONDS, isolation_level=None)
        try:
            db.execute("BEGIN")  # one snapshot for the revision and the rows
            exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'feedback'")
            if exists.fetchone() is None:
                return None if self._rules.revision == (0, 0) else _Rules((0, 0), {}, {})
            top, count = db.execute("SELECT COALESCE(MAX(id), 0), COUNT(*) FROM feedback").fetchone()
            if (top, count) == self._rules.revision:
                return None
            rows = [Feedback(*row) for row in db.execute(f"SELECT {COLUMNS} FROM feedback ORDER BY id")]
        finally:
            db.close()
        kept = [f for f in rows if valid(f)]
        if len(kept) < len(rows):
            log.warning(
                "feedback_rules_ignored", database=self.path, rules=len(rows) - len(kept),
                reason="they fail the rule check (`logstream feedback list` shows them as refused)",
            )  # fmt: skip
        return _compile(kept, (top, count))

    def _failed(self, kind: str, exc: Exception) -> None:
        FEEDBACK_REFRESH_ERRORS.labels(kind=kind).inc()
        if kind not in self._failing:
            self._failing.add(kind)
            log.error(
                "feedback_refresh_failed", database=self.path, kind=kind, error=repr(exc),
                rules="the last ones read stay in force",
            )  # fmt: skip

    def verdict(self, template: str, stream: str, now: float | None = None) -> str | None:
        """ "normal", "anomaly" or None for a mined template on a stream: the verdict of the
        most specific rule in force covering both (on a tie "anomaly")."""
        at = time.time() if now is None else now
        found: set[str] = set()
        best: Rank | None = None
        for rank, rule in self._covering(template):
            if best is not None and rank < best:
                break
            if not fnmatch.fnmatchcase(stream, rule.stream):
                continue
            feedback = rule.in_force(at)
            if feedback is not None:
                best = rank
                found.add(feedback.verdict)
        if not found:
            return None
        return "anomaly" if "anomaly" in found else "normal"

    def effective(self, now: float | None = None) -> list[Feedback]:
        """The rules in force at `now` (one per template and stream glob), oldest first."""
        at = time.time() if now is None else now
        in_force = [f for r in self._all_rules() if (f := r.in_force(at)) is not None]
        return sorted(in_force, key=lambda f: f.id or 0)

    def _all_rules(self) -> Iterator[_Rule]:
        for same_length in self._rules.by_length.values():
            yield from same_length

    def _covering(self, mined: str) -> tuple[tuple[Rank, _Rule], ...]:
        """The rules whose template covers `mined`, most specific first (remembered)."""
        rules = self._rules
        hit = rules.cache.get(mined)
        if hit is None:
            tokens = split_tokens(mined)
            ranked = [
                ((shared, scope_rank(r.stream)), r)
                for r in rules.by_length.get(len(tokens), ())
                if (shared := shared_text(r.tokens, tokens))
            ]
            hit = tuple(sorted(ranked, key=lambda pair: pair[0], reverse=True))
            if len(rules.cache) < MAX_CACHED:  # bounded: hostile input mints templates without end
                rules.cache[mined] = hit
        return hit


# -- what an operator points at -> a template ------------------------------------------


def template_of(line: str, normalizer: Normalizer) -> str:
    """The template the detector's miner gives a line the first time it sees its pattern."""
    return PatternMiner().add(normalizer.mask(line)).template


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
