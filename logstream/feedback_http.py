"""`POST /feedback` on serve's HTTP port: the same verdicts as `logstream feedback`, for a Slack
button or a PagerDuty webhook.

    curl -H "Authorization: Bearer $TOKEN" -d '{"verdict": "normal", "fingerprint": "logstream-3f2a..."}' \\
        http://logstream:8080/feedback

Body (JSON): `verdict` ("normal" | "anomaly"), exactly one of `template`, `line`,
`fingerprint`, and optionally `by` and `comment`. `at` (a file path or an audit-log lookup)
is CLI-only: a remote caller must not make the server read its files.

A verdict changes detection, so the endpoint is closed unless configured: with
`feedback.token` a request needs `Authorization: Bearer <token>` (401 otherwise); without
a token it answers 403, unless `feedback.allow_without_token` opens it on purpose. Answers:
201 with the stored verdict, 400 with a one-line reason, 413 for a body over 64 KiB.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from logstream.feedback import Feedback, FeedbackError, FeedbackRules, FeedbackStore, Target, resolve
from logstream.metrics import FEEDBACK
from logstream.normalize import Normalizer
from logstream.settings import ServeSettings

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 65_536
TARGETS = ("template", "line", "fingerprint")
FIELDS = {"verdict", "by", "comment", *TARGETS}


class FeedbackEndpoint:
    """The WSGI app behind /feedback. `normalizer` is set once the model is loaded (a raw
    `line` needs it; until then such a request answers 503)."""

    def __init__(
        self, store: FeedbackStore, rules: FeedbackRules, token: str | None, allow_without_token: bool
    ) -> None:
        self.store = store
        self.rules = rules
        self.token = token
        self.allow_without_token = allow_without_token
        self.normalizer: Normalizer | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        status, body = self._handle(environ)
        start_response(status, [("Content-Type", "application/json")])
        return [json.dumps(body).encode() + b"\n"]

    def _handle(self, environ: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if environ.get("REQUEST_METHOD") != "POST":
            return "405 Method Not Allowed", {"error": "POST a JSON verdict"}
        denied = self._denied(environ.get("HTTP_AUTHORIZATION", ""))
        if denied is not None:
            FEEDBACK.labels(verdict="", outcome="denied").inc()
            return denied
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return "400 Bad Request", {"error": "Content-Length is not a number"}
        if length > MAX_BODY_BYTES:
            return "413 Content Too Large", {"error": f"body over {MAX_BODY_BYTES} bytes"}
        try:
            request = json.loads(environ["wsgi.input"].read(length) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "400 Bad Request", {"error": "body is not JSON"}
        try:
            feedback = self._resolve(request)
        except FeedbackError as exc:
            FEEDBACK.labels(verdict="", outcome="rejected").inc()
            return "400 Bad Request", {"error": str(exc)}
        except _NotReady:
            return "503 Service Unavailable", {"error": "the model is not loaded yet; retry"}
        try:
            stored = self.store.add(feedback)
        except FeedbackError as exc:  # the database is locked, full or gone: the caller may retry
            log.error("feedback_not_stored", error=str(exc))
            return "503 Service Unavailable", {"error": str(exc)}
        self.rules.refresh(force=True)  # in effect for the next batch, not in refresh_seconds
        FEEDBACK.labels(verdict=stored.verdict, outcome="stored").inc()
        log.info("feedback_stored", verdict=stored.verdict, template=stored.template, by=stored.created_by)
        return "201 Created", stored.to_json()

    def _denied(self, authorization: str) -> tuple[str, dict[str, Any]] | None:
        if self.token is None:
            if self.allow_without_token:
                return None
            return "403 Forbidden", {
                "error": "feedback is closed: set feedback.token (or allow_without_token)"
            }
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), self.token.encode()):
            return "401 Unauthorized", {"error": "missing or wrong bearer token"}
        return None

    def _resolve(self, request: Any) -> Feedback:
        if not isinstance(request, dict):
            raise FeedbackError("body: expected a JSON object")
        unknown = sorted(set(request) - FIELDS)
        if unknown:
            raise FeedbackError(f"{unknown[0]}: unknown field (expected {', '.join(sorted(FIELDS))})")
        if not all(isinstance(v, str) for v in request.values()):
            raise FeedbackError("every field is a string")
        if "line" in request and self.normalizer is None:
            raise _NotReady
        target = Target(**{k: request[k] for k in TARGETS if k in request})
        return resolve(
            request.get("verdict", ""), target, self.store, normalizer=self.normalizer,
            created_by=request.get("by", ""), comment=request.get("comment", ""),
        )  # fmt: skip


class _NotReady(Exception):
    """A raw line arrived before the model (its masking) was loaded."""


def open_feedback(settings: ServeSettings) -> FeedbackEndpoint | None:
    """The store, its rules and the endpoint for one serve process; None when there is no
    feedback database (no `feedback.database` and no alert outbox): then /feedback is a 404."""
    database = settings.feedback.database
    if database is None and settings.sink.kind == "alerts" and settings.sink.routes is not None:
        from logstream.alerts.config import load_config

        database = Path(load_config(settings.sink.routes, secrets=False).delivery.outbox)
    if database is None:
        return None
    store = FeedbackStore(database)
    token = settings.feedback.token.get_secret_value() if settings.feedback.token else None
    rules = FeedbackRules(store, settings.feedback.refresh_seconds)
    return FeedbackEndpoint(store, rules, token, settings.feedback.allow_without_token)
