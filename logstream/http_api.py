"""`POST /feedback` on serve's feedback port: the same verdicts as `logstream feedback`, for a
Slack button or a PagerDuty webhook; and the incident memory's routes (below).

    curl -H "Authorization: Bearer $TOKEN" -d '{"verdict": "normal", "fingerprint": "logstream-3f2a..."}' \\
        http://logstream:8081/feedback

Body (JSON object): `verdict` ("normal" | "anomaly"); exactly one of `template` (text),
`line`, `fingerprint`; with a fingerprint whose group holds several templates, `template`
as a number (1-based, as the 409 answer lists them) or `"all": true`; optionally `stream`
(a glob, default every stream), `for` (a duration, "2h") or `until` (RFC 3339), `comment`.
`at` (a file path or an audit-log lookup) is CLI-only: a remote caller must not make the
server read its files.

A verdict changes detection, so the endpoint is closed unless configured: with
`feedback.tokens_file` (one `name:token` line per operator or integration) a request needs
`Authorization: Bearer <token>` (401 otherwise) and the verdict is stored as by that name,
with the caller's address; the caller cannot name an author. Without tokens it answers 403,
unless `feedback.allow_without_token` opens it on purpose ("anonymous").

The body is read only after the token checks, and only as far as its Content-Length: 411
without one, 400 for one that is not a number, 413 above 64 KiB (nothing read), 408 when the
client stops sending. Answers: 201 `{"stored": [...]}`, 400 with a one-line reason, 409 with
`templates` when a fingerprint's group holds several, 503 while the model (whose masking a
raw line needs) loads or the database is unavailable.

The incident memory (logstream.memory; serve keeps one with sink kind alerts), with the
same tokens, author and body limits:

    POST /incidents/FINGERPRINT/resolution   {"text": "what it was and what was done"}
    GET  /incidents/FINGERPRINT              the incident, its verdicts, the incidents like it
    GET  /incidents/search?q=TEXT            the incidents most like some text (words)

as `logstream incidents resolve|show|search` do; the resolution's author is the token's
user. Answers: 200 with JSON, 400 with a one-line reason, 404 for an unknown fingerprint
(or without a memory), 405 for another method, 503 while the memory's database is
unavailable.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import structlog

from logstream.lifecycle.feedback import (
    EVERY_STREAM,
    Feedback,
    FeedbackError,
    FeedbackRules,
    FeedbackStore,
    FeedbackUnavailable,
)
from logstream.lifecycle.feedback_targets import AmbiguousTarget, Stamp, Target, expiry, resolve
from logstream.memory.retrieval import IncidentMemory
from logstream.memory.store import IncidentError, IncidentUnavailable, UnknownIncident
from logstream.metrics import FEEDBACK, BoundedWSGIServer, HttpLimits, start_server
from logstream.settings import ServeSettings, SettingsError
from logstream.text.normalize import Normalizer

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 65_536
FIELDS = {"verdict", "template", "line", "fingerprint", "all", "stream", "for", "until", "comment"}
ANONYMOUS = "anonymous"
MIN_TOKEN_CHARS = 16  # a guessable token would make the author whoever guessed it
MAX_QUERY_CHARS = 4096  # a search's text: a log line, or a few words
ROUTES = "POST /feedback; GET /incidents/search?q=TEXT, GET /incidents/FINGERPRINT, POST /incidents/FINGERPRINT/resolution"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
Answer = tuple[str, dict[str, Any]]


def _digest(token: str) -> str:
    """Tokens are compared by their SHA-256: a dict lookup that leaks nothing of the token."""
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def load_tokens(path: Path) -> dict[str, str]:
    """token digest -> user name, from a file of `name:token` lines (blank lines and `#`
    comments skipped); SettingsError naming the line for anything else."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"feedback.tokens_file {path}: cannot read: {exc}") from None
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep, token = entry.partition(":")
        where = f"feedback.tokens_file {path}:{number}"
        if not sep or not _NAME.fullmatch(name):
            raise SettingsError(f"{where}: expected name:token (a name of letters, digits, . _ @ -)")
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise SettingsError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters, no spaces")
        if _digest(token) in tokens:
            raise SettingsError(f"{where}: this token is also {tokens[_digest(token)]}'s")
        tokens[_digest(token)] = name
    if not tokens:
        raise SettingsError(f"feedback.tokens_file {path}: no name:token line")
    return tokens


class FeedbackEndpoint:
    """The WSGI app of the feedback port. `normalizer` is set once the model is loaded (a raw
    `line` needs it; until then such a request answers 503); `incidents` once the alert sink
    has opened its incident memory."""

    def __init__(
        self,
        store: FeedbackStore,
        rules: FeedbackRules,
        tokens: dict[str, str] | None,
        allow_without_token: bool,
        retention_days: float | None = None,
    ) -> None:
        self.store = store
        self.rules = rules
        self.tokens = tokens
        self.allow_without_token = allow_without_token
        self.retention_days = retention_days
        self.normalizer: Normalizer | None = None
        self.incidents: IncidentMemory | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if path == "/feedback":
            status, body = self._handle(environ)
        elif path.startswith("/incidents/"):
            status, body = self._incident_route(environ, path.removeprefix("/incidents/").split("/"))
        else:
            status, body = "404 Not Found", {"error": ROUTES}
        start_response(status, [("Content-Type", "application/json")])
        return [json.dumps(body).encode() + b"\n"]

    def _incident_route(self, environ: dict[str, Any], parts: list[str]) -> Answer:
        author = self._author(environ.get("HTTP_AUTHORIZATION", ""))
        if isinstance(author, tuple):
            return author
        if self.incidents is None:
            return "404 Not Found", {
                "error": "no incident memory here (serve keeps one with sink kind alerts)"
            }
        method = environ.get("REQUEST_METHOD")
        if parts == ["search"]:
            route, wanted = lambda memory: self._search(memory, environ), "GET"
        elif len(parts) == 1 and parts[0]:
            route, wanted = lambda memory: _show(memory, parts[0]), "GET"
        elif len(parts) == 2 and parts[0] and parts[1] == "resolution":
            route, wanted = lambda memory: _resolve(memory, parts[0], environ, author), "POST"
        else:
            return "404 Not Found", {"error": ROUTES}
        if method != wanted:
            return "405 Method Not Allowed", {"error": f"{wanted} only"}
        try:
            return route(self.incidents)
        except UnknownIncident as exc:
            return "404 Not Found", {"error": str(exc)}
        except IncidentUnavailable as exc:  # locked, full or closed: the caller may retry
            log.error("incident_memory_unavailable", error=str(exc))
            return "503 Service Unavailable", {"error": str(exc)}
        except (IncidentError, FeedbackError) as exc:
            return "400 Bad Request", {"error": str(exc)}

    def _search(self, memory: IncidentMemory, environ: dict[str, Any]) -> Answer:
        query = parse_qs(str(environ.get("QUERY_STRING", ""))).get("q", [""])
        text = query[0].strip()
        if len(query) != 1 or not text:
            return "400 Bad Request", {"error": "q: one text to look for (?q=...)"}
        if len(text) > MAX_QUERY_CHARS:
            return "400 Bad Request", {"error": f"q: longer than {MAX_QUERY_CHARS} characters"}
        normalizer = self.normalizer or Normalizer()  # the model's masking once it is loaded
        return "200 OK", {"incidents": [p.to_json() for p in memory.search([normalizer.mask(text)])]}

    def _handle(self, environ: dict[str, Any]) -> Answer:
        if environ.get("REQUEST_METHOD") != "POST":
            return "405 Method Not Allowed", {"error": "POST a JSON verdict"}
        author = self._author(environ.get("HTTP_AUTHORIZATION", ""))
        if isinstance(author, tuple):
            FEEDBACK.labels(verdict="", outcome="denied").inc()
            return author
        body = read_body(environ)
        if isinstance(body, tuple):
            FEEDBACK.labels(verdict="", outcome="rejected").inc()
            return body
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            FEEDBACK.labels(verdict="", outcome="rejected").inc()
            return "400 Bad Request", {"error": "body is not JSON"}
        try:
            return self._store(self._resolve(request, author, str(environ.get("REMOTE_ADDR", ""))))
        except AmbiguousTarget as exc:
            FEEDBACK.labels(verdict="", outcome="ambiguous").inc()
            return "409 Conflict", {"error": str(exc), "templates": exc.templates, "unlisted": exc.unlisted}
        except FeedbackUnavailable as exc:  # locked, full or gone: the caller may retry
            log.error("feedback_not_stored", error=str(exc))
            return "503 Service Unavailable", {"error": str(exc)}
        except FeedbackError as exc:
            FEEDBACK.labels(verdict="", outcome="rejected").inc()
            return "400 Bad Request", {"error": str(exc)}
        except _NotReady:
            return "503 Service Unavailable", {"error": "the model is not loaded yet; retry"}

    def _store(self, made: list[Feedback]) -> Answer:
        stored = [self.store.add(feedback) for feedback in made]
        if self.retention_days is not None:
            self.store.prune(self.retention_days)
        self.rules.refresh(force=True)  # in effect for the next batch, not in refresh_seconds
        for f in stored:
            FEEDBACK.labels(verdict=f.verdict, outcome="stored").inc()
            log.info(
                "feedback_stored", verdict=f.verdict, template=f.template, stream=f.stream, by=f.created_by,
                remote=f.remote, expires_at=f.expires_at,
            )  # fmt: skip
        return "201 Created", {"stored": [f.to_json() for f in stored]}

    def _author(self, authorization: str) -> str | Answer:
        """The user the bearer token names, or the refusal."""
        if self.tokens is None:
            if self.allow_without_token:
                return ANONYMOUS
            return "403 Forbidden", {
                "error": "feedback is closed: set feedback.tokens_file (or allow_without_token)"
            }
        scheme, _, given = authorization.partition(" ")
        name = self.tokens.get(_digest(given.strip())) if scheme.lower() == "bearer" else None
        if name is None:
            return "401 Unauthorized", {"error": "missing or unknown bearer token"}
        return name

    def _resolve(self, request: Any, author: str, remote: str) -> list[Feedback]:
        if not isinstance(request, dict):
            raise FeedbackError("body: expected a JSON object")
        unknown = sorted(set(request) - FIELDS)
        if unknown:
            raise FeedbackError(f"{unknown[0]}: unknown field (expected {', '.join(sorted(FIELDS))})")
        by_number = "fingerprint" in request  # then template picks one of its group's templates
        pick, every = request.get("template") if by_number else None, request.get("all", False)
        if by_number and pick is not None and (isinstance(pick, bool) or not isinstance(pick, int)):
            raise FeedbackError("template: with a fingerprint, the number of one of its group's templates")
        if not isinstance(every, bool):
            raise FeedbackError("all: true or false")
        if not all(
            isinstance(v, str)
            for k, v in request.items()
            if k != "all" and not (by_number and k == "template")
        ):
            raise FeedbackError("every field but all (and a template number) is a string")
        if "line" in request and self.normalizer is None:
            raise _NotReady
        target = Target(
            template=None if by_number else request.get("template"), line=request.get("line"),
            fingerprint=request.get("fingerprint"), pick=pick, every=every,
        )  # fmt: skip
        stamp = Stamp(
            created_by=author, remote=remote, comment=request.get("comment", ""),
            stream=request.get("stream", EVERY_STREAM),
            expires_at=expiry(request.get("for"), request.get("until")),
        )  # fmt: skip
        return resolve(
            request.get("verdict", ""), target, self.store, normalizer=self.normalizer, stamp=stamp
        )


def _show(memory: IncidentMemory, fingerprint: str) -> Answer:
    """One incident with its verdicts, and the past incidents most like it (`incidents show`)."""
    incident = memory.store.get(fingerprint)
    if incident is None:
        raise UnknownIncident(f"fingerprint {fingerprint}: no such incident")
    verdicts = [f.to_json() for f in memory.store.verdicts_for(incident, memory.clock())]
    similar = [p.to_json() for p in memory.similar(fingerprint)]
    return "200 OK", {"incident": incident.to_json() | {"verdicts": verdicts}, "similar": similar}


def _resolve(memory: IncidentMemory, fingerprint: str, environ: dict[str, Any], author: str) -> Answer:
    """`{"text": ...}`: the incident's resolution, written as by the token's user."""
    body = read_body(environ)
    if isinstance(body, tuple):
        return body
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "400 Bad Request", {"error": "body is not JSON"}
    if not isinstance(request, dict) or set(request) != {"text"} or not isinstance(request["text"], str):
        return "400 Bad Request", {"error": 'body: expected {"text": "what it was and what was done"}'}
    incident = memory.resolve(fingerprint, request["text"], author)
    log.info("incident_resolved", alert_id=fingerprint, by=author, remote=environ.get("REMOTE_ADDR", ""))
    return "200 OK", {"incident": incident.to_json()}


class _NotReady(Exception):
    """A raw line arrived before the model (its masking) was loaded."""


def read_body(environ: dict[str, Any], limit: int = MAX_BODY_BYTES) -> bytes | Answer:
    """The request body, read only as far as its Content-Length and never past `limit`; or
    the answer refusing it (411 without a length, 400 for one that is not a count of bytes,
    413 over the limit, 408 when the client stops sending)."""
    text = str(environ.get("CONTENT_LENGTH") or "").strip()
    if not text:
        return "411 Length Required", {"error": "send a Content-Length"}
    if not (text.isascii() and text.isdigit()):
        return "400 Bad Request", {"error": "Content-Length is not a number of bytes"}
    if len(text) > len(str(limit)) or int(text) > limit:
        return "413 Content Too Large", {"error": f"body over {limit} bytes"}
    length = int(text)
    try:
        body = environ["wsgi.input"].read(length)
    except TimeoutError:
        return "408 Request Timeout", {"error": "the body stopped arriving"}
    if len(body) < length:
        return "400 Bad Request", {"error": "body shorter than its Content-Length"}
    return body


def open_feedback(settings: ServeSettings) -> FeedbackEndpoint | None:
    """The store, its rules and the endpoint for one serve process; None when there is no
    feedback database (no `feedback.database` and no alert outbox): then nothing listens
    on the feedback port. Verdicts past the retention are deleted here, at start."""
    database = settings.feedback.database
    if database is None and settings.sink.kind == "alerts" and settings.sink.routes is not None:
        from logstream.alerts.config import load_config

        database = Path(load_config(settings.sink.routes, secrets=False).delivery.outbox)
    if database is None:
        return None
    tokens = load_tokens(settings.feedback.tokens_file) if settings.feedback.tokens_file else None
    store = FeedbackStore(database)
    try:
        pruned = store.prune(settings.feedback.retention_days)
    except FeedbackError as exc:  # locked or unreadable right now: the next POST prunes
        log.error("feedback_prune_failed", error=str(exc))
    else:
        log.info("feedback_pruned", verdicts=pruned, retention_days=settings.feedback.retention_days)
    rules = FeedbackRules(store, settings.feedback.refresh_seconds)
    return FeedbackEndpoint(
        store, rules, tokens, settings.feedback.allow_without_token, settings.feedback.retention_days
    )


def serve_feedback(settings: ServeSettings, endpoint: FeedbackEndpoint) -> BoundedWSGIServer | None:
    """The feedback port's server (the http section's limits), None without `feedback.port`;
    SettingsError if it cannot listen."""
    if settings.feedback.port is None:
        return None
    limits = HttpLimits(settings.http.timeout_seconds, settings.http.max_connections)
    try:
        return start_server(settings.feedback.host, settings.feedback.port, endpoint, "feedback", limits)
    except OSError as exc:
        address = f"{settings.feedback.host}:{settings.feedback.port}"
        raise SettingsError(f"feedback: cannot listen on {address}: {exc.strerror}") from None
