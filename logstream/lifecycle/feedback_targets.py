"""What an operator points at, resolved to the verdicts to store (logstream.lifecycle.feedback).

A target is a template as alerts show it, a raw line (masked by the model's rules), an
alert's fingerprint (its group in the outbox), or a place: `path:line` (read from the file)
or `topic/partition@offset` (looked up in serve's audit log).

An alert group can hold several templates (grouped by stream, by default, an incident
gathers every kind of line that alerted on that stream). A verdict by fingerprint then
names which: `pick` (a number, as `AmbiguousTarget` lists them) or `every`; the group's
first template is never chosen silently. The outbox keeps the first line of each of a
group's first MAX_EXAMPLES distinct alerts; their templates are the first alert's mined
template and the other lines masked and mined as the detector would on first sight.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logstream.lifecycle.feedback import (
    EVERY_STREAM,
    Feedback,
    FeedbackError,
    FeedbackStore,
    audit_entries,
    check,
    template_of,
)
from logstream.text.normalize import Normalizer

if TYPE_CHECKING:
    from logstream.alerts.grouping import Group


@dataclass(frozen=True)
class Target:
    """What an operator points at; exactly one of template, line, fingerprint, at is set.
    With a fingerprint, `pick` (1-based) or `every` chooses among its group's templates."""

    template: str | None = None
    line: str | None = None
    fingerprint: str | None = None
    at: str | None = None
    pick: int | None = None
    every: bool = False

    def describe(self) -> str:
        given = [
            (k, v) for k in ("template", "line", "fingerprint", "at") if (v := getattr(self, k)) is not None
        ]
        if len(given) != 1:
            raise FeedbackError("give exactly one of template, line, fingerprint, at")
        if (self.pick is not None or self.every) and self.fingerprint is None:
            raise FeedbackError("a template number or all: only with a fingerprint")
        if self.pick is not None and self.every:
            raise FeedbackError("give a template number or all, not both")
        return f"{given[0][0]}:{given[0][1]}"


@dataclass(frozen=True)
class Stamp:
    """Who gives the verdicts (the authenticated user and where from), why, and their reach."""

    created_by: str = ""
    remote: str = ""
    comment: str = ""
    stream: str = EVERY_STREAM
    expires_at: float | None = None


class AmbiguousTarget(FeedbackError):
    """A fingerprint whose alert group holds several templates, and no choice among them."""

    def __init__(self, fingerprint: str, templates: list[str], unlisted: int) -> None:
        self.templates = templates
        self.unlisted = unlisted
        more = f" (and {unlisted} more distinct alerts whose lines it does not keep)" if unlisted else ""
        super().__init__(
            f"fingerprint {fingerprint}: its alert group holds {len(templates)} templates{more};"
            f" pick one by number (1..{len(templates)}) or all of them"
        )


def group_templates(group: Group, normalizer: Normalizer | None) -> tuple[list[tuple[str, str]], int]:
    """(template, example line) of each distinct alert the group keeps a line of, first alert
    first, one per template; and how many distinct alerts it holds beyond those. The lines
    are masked with `normalizer`, the model's rules (default: the default rules)."""
    first = group.template_text
    found = [(first, group.first_line)] if first else []
    lines = group.examples[1:] if first else (group.examples or (group.first_line,))
    masking = normalizer or Normalizer()  # without the model's: what every `logstream train` writes
    for line in lines:
        template = template_of(line, masking)
        if all(template != t for t, _ in found):
            found.append((template, line))
    return found, max(0, len(group.fingerprints) - max(len(group.examples), 1))


def expiry(duration: str | None, until: str | None, now: float | None = None) -> float | None:
    """The expiry time of `--for DURATION` or `--until TIME` (None: never); FeedbackError
    for both, or for one that does not parse."""
    from logstream.alerts.config import parse_duration, parse_time  # pydantic: only here

    if duration is not None and until is not None:
        raise FeedbackError("give for (a duration) or until (a time), not both")
    try:
        if duration is not None:
            return (time.time() if now is None else now) + parse_duration(duration)
        return None if until is None else parse_time(until)
    except ValueError as exc:
        raise FeedbackError(f"expires: {exc}") from None


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


def resolve(
    verdict: str,
    target: Target,
    store: FeedbackStore,
    *,
    normalizer: Normalizer | None = None,
    audit_log: Path | None = None,
    stamp: Stamp = Stamp(),
) -> list[Feedback]:
    """The verdicts a target stands for (one, or with `every` one per template of an alert
    group), checked: each with its template, an example line and the model when known. A
    raw line (given, or read from `path:line`) and a group's other lines need the model's
    `normalizer` to become templates."""
    described = target.describe()
    base = Feedback(
        verdict, "", described, created_by=stamp.created_by, comment=stamp.comment, stream=stamp.stream,
        expires_at=stamp.expires_at, remote=stamp.remote,
    )  # fmt: skip
    if target.fingerprint is not None:
        chosen = _from_group(target, store, normalizer)
        made = [dataclasses.replace(base, template=t, line=line, model=m) for t, line, m in chosen]
    else:
        made = [_one(target, base, described, normalizer, audit_log)]
    for feedback in made:
        check(feedback, time.time())  # before anyone stores it: the HTTP endpoint answers 400
    return made


def _one(
    target: Target, base: Feedback, described: str, normalizer: Normalizer | None, audit_log: Path | None
) -> Feedback:
    template, line, model = target.template, target.line or "", ""
    if target.at is not None:
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
    return dataclasses.replace(base, template=template, line=line, model=model)


def incident(store: FeedbackStore, dedup_key: str) -> Group | None:
    """The alert group with this fingerprint, when the store's file is also the alert outbox."""
    from logstream.alerts.outbox import find_incident  # pydantic and the routes: only here

    with store.connection() as db:
        return find_incident(db, dedup_key)


def _from_group(
    target: Target, store: FeedbackStore, normalizer: Normalizer | None
) -> list[tuple[str, str, str]]:
    """(template, line, model) of the group's template(s) the target chooses."""
    assert target.fingerprint is not None
    group = incident(store, target.fingerprint)
    if group is None:
        raise FeedbackError(f"fingerprint {target.fingerprint}: no such alert in {store.path}")
    found, unlisted = group_templates(group, normalizer)
    if target.every:
        return [(t, line, group.model_id) for t, line in found]
    if target.pick is None:
        if len(found) > 1 or unlisted:
            raise AmbiguousTarget(target.fingerprint, [t for t, _ in found], unlisted)
        return [(found[0][0], found[0][1], group.model_id)]
    if not 1 <= target.pick <= len(found):
        raise FeedbackError(f"template: {target.pick} is not one of the group's templates (1..{len(found)})")
    template, line = found[target.pick - 1]
    return [(template, line, group.model_id)]
