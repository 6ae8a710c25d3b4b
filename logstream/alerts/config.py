"""The routes file: Alertmanager's vocabulary, validated at load, secrets resolved.

A routes file names receivers (each with one or more channel configs), a route
tree that sends anomalies to receivers, the grouping timers, the delivery
policy and silences. Everything is checked when the file is loaded, so a typo
or an unknown receiver fails at start with the field's path and the reason,
never at 3 a.m. when the first alert fires.

Secrets (webhook URLs, routing keys, header values) are written as `${ENV}`
(also inside a longer string) or `file:/absolute/path` (one slash after the
colon: a mounted secret file, read whole, at most 64 KiB, trailing whitespace
stripped). `file://...` is a URL, not a secret reference, and is refused.
Secrets are resolved here, held as `SecretStr` (masked in repr and logs) and
only unwrapped when a request is sent. The outbox stores alerts, never
rendered requests, so no secret reaches the database either.

Receiver URLs must be http(s) with a host; PagerDuty's must be https (plain
http only to a loopback address, for local mocks). Errors name the field and
the reason, never the URL (it may hold a token).

Every problem is reported at once (one line, `; `-separated), so a file is
fixed in one pass. `parse_config(..., secrets=False)` checks a file without
its secrets (CI, a laptop): references are checked for form, never resolved.
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from logstream.alerts.matchers import Matcher, globs, is_label_name, parse_matcher
from logstream.errors import UserError

# Labels every anomaly carries (see routing.anomaly_labels). Labels taken from the record
# (serve's input.label_fields / label_regex) are declared in the routes file's `record_labels`.
LABEL_NAMES = ("stream", "severity", "kind", "level", "template", "source", "model_id")
ALL_LABELS = "..."  # `group_by: ['...']`: group by every label (Alertmanager's spelling)
TEMPLATE_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\}\}")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SECRET_FILE_MAX_BYTES = 64 * 1024


class AlertConfigError(UserError, ValueError):
    """A routes file that cannot be used; the message names the file, field and reason."""


def parse_duration(value: Any) -> float:
    """'500ms', '30s', '5m', '1h30m', '1d' or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value and _DURATION.sub("", value.strip()) == "":
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(value.strip()))
    else:
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 30s, 5m, 4h, 1d)")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    return seconds


def parse_time(value: Any) -> float:
    """RFC 3339 text ('2026-11-29T20:00:00Z'), a YAML timestamp or unix seconds -> unix seconds."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return parse_time(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
        except ValueError:
            pass
    raise ValueError(f"not a time: {value!r} (use RFC 3339, e.g. 2026-11-29T20:00:00Z)")


def rfc3339(ts: float) -> str:
    """Unix seconds -> '2026-11-29T17:00:00.000Z' (what PagerDuty and Alertmanager accept)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _resolving(info: ValidationInfo | None) -> bool:
    """False while checking a file without its secrets (`parse_config(secrets=False)`)."""
    return not (info is not None and isinstance(info.context, dict) and info.context.get("secrets") is False)


def resolve_secret(value: Any, info: ValidationInfo | None = None) -> str:
    """Resolve `file:/path` and `${ENV}` references; the value itself never appears in errors.

    Without secrets (see `_resolving`) a reference is only checked for form and kept as is."""
    if not isinstance(value, str):
        raise ValueError("must be a string, `${ENV_VAR}` or `file:/path`")
    if not _resolving(info):
        if value.startswith("file:") and (value.startswith("file://") or not value[5:].startswith("/")):
            raise ValueError("a secret file is file:/absolute/path (file:// URLs are refused)")
        return value
    if value.startswith("file:"):
        return _read_secret_file(value[len("file:") :])

    def env(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ValueError(f"environment variable {name} is not set")
        return os.environ[name]

    return _ENV_REF.sub(env, value)


def _read_secret_file(ref: str) -> str:
    """`file:/abs/path` -> the file's text. Refuses `file://` URLs, relative paths,
    non-regular files (a FIFO or /dev/zero would block or never end) and big files."""
    if ref.startswith("//"):
        raise ValueError("file:// URLs are not secret references (write file:/absolute/path)")
    path = Path(ref).expanduser()
    if not path.is_absolute():
        raise ValueError(f"secret file must be an absolute path: {ref!r}")
    try:
        if not path.is_file():
            raise ValueError(f"secret file {path} is not a regular file")
        if path.stat().st_size > SECRET_FILE_MAX_BYTES:
            raise ValueError(f"secret file {path} is larger than {SECRET_FILE_MAX_BYTES} bytes")
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None


def check_url(url: str, *, https_only: bool = False) -> None:
    """http(s) with a host; `https_only` allows plain http to loopback only. The reason
    names the scheme or the missing part, never the URL (it may carry a token)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        raise ValueError("not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        shown = f"{parts.scheme!r}" if parts.scheme else "none"
        raise ValueError(f"URL scheme {shown} is not allowed (use http or https)")
    if not host:
        raise ValueError("URL has no host")
    if https_only and parts.scheme != "https" and not _loopback(host):
        raise ValueError("URL must be https (plain http only to a loopback address)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secret_url(value: SecretStr, info: ValidationInfo) -> SecretStr:
    url = value.get_secret_value()
    if not _resolving(info):
        if url.startswith(("${", "file:")):
            return value  # the whole URL is a reference: nothing to check without it
        url = _ENV_REF.sub("x", url)
    check_url(url)
    return value


def _http_url(value: str) -> str:
    check_url(value)
    return value


def _https_url(value: str) -> str:
    check_url(value, https_only=True)
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _secret(value: Any, info: ValidationInfo) -> str:
    return resolve_secret(value, info)


Secret = Annotated[SecretStr, BeforeValidator(_secret)]
SecretURL = Annotated[SecretStr, BeforeValidator(_secret), AfterValidator(_secret_url)]
HttpURL = Annotated[str, AfterValidator(_http_url)]
HttpsURL = Annotated[str, AfterValidator(_https_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RateLimit(_Strict):
    """At most `count` requests per `per` seconds to one channel; excess waits, never drops."""

    count: int = Field(gt=0)
    per: Duration = Field(gt=0)


class _ChannelConfig(_Strict):
    timeout: Duration = Field(default=10.0, gt=0)
    rate_limit: RateLimit | None = None


class WebhookConfig(_ChannelConfig):
    """Generic JSON webhook; the body is Alertmanager's webhook payload (version 4)."""

    url: SecretURL
    headers: dict[str, Secret] = {}
    send_resolved: bool = True
    external_url: str = ""


class SlackConfig(_ChannelConfig):
    """Slack incoming webhook (`api_url` is the hooks.slack.com URL, a secret)."""

    api_url: SecretURL
    send_resolved: bool = False


class PagerDutyConfig(_ChannelConfig):
    """PagerDuty Events API v2; `routing_key` is the integration key (a secret)."""

    routing_key: Secret
    url: HttpsURL = "https://events.pagerduty.com/v2/enqueue"
    send_resolved: bool = True


class AlertmanagerConfig(_ChannelConfig):
    """An Alertmanager to hand alerts to: POST {url}/api/v2/alerts."""

    url: HttpURL
    headers: dict[str, Secret] = {}
    send_resolved: bool = True


class Receiver(_Strict):
    """A named set of channels; an alert routed here goes to each of them."""

    name: str = Field(min_length=1)
    webhook_configs: list[WebhookConfig] = []
    slack_configs: list[SlackConfig] = []
    pagerduty_configs: list[PagerDutyConfig] = []
    alertmanager_configs: list[AlertmanagerConfig] = []


def _matcher_list(value: Any) -> tuple[Matcher, ...]:
    """`matchers: ['team="db"', ...]` -> Matchers (each string checked)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ValueError("expected a list of matchers like 'team=\"db\"'")
    return tuple(v if isinstance(v, Matcher) else parse_matcher(v) for v in value)


def _silence_matchers(value: Any) -> tuple[Matcher, ...]:
    """A silence's matchers: a list of matcher strings, or the older {label: glob} mapping."""
    if isinstance(value, dict):
        return globs({str(k): str(v) for k, v in value.items()})
    return _matcher_list(value)


Matchers = Annotated[tuple[Matcher, ...], BeforeValidator(_matcher_list)]


def _known(names: list[str], info: ValidationInfo) -> None:
    """Every label name is one an anomaly can carry (a typo would match nothing, silently)."""
    known = info.context.get("labels") if isinstance(info.context, dict) else None
    known = known if known is not None else LABEL_NAMES
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown label {unknown[0]!r} (known: {', '.join(known)})")


class Route(_Strict):
    """One node of the route tree; unset fields inherit from the parent.

    A node matches when all of `match` (label globs), `matchers` (Alertmanager's
    `=`, `!=`, `=~`, `!~`) and `min_score` hold."""

    receiver: str | None = None
    match: dict[str, str] = {}
    matchers: Matchers = ()
    min_score: float | None = None
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    # a link template (see Link) to the runbook for alerts of this route; inherited
    runbook_url: str | None = None
    continue_: bool = Field(default=False, alias="continue")
    routes: list[Route] = []

    @field_validator("match")
    @classmethod
    def _match_labels(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        _known(list(value), info)
        return value

    @field_validator("matchers")
    @classmethod
    def _matcher_labels(cls, value: tuple[Matcher, ...], info: ValidationInfo) -> tuple[Matcher, ...]:
        _known([m.name for m in value], info)
        return value

    @field_validator("group_by")
    @classmethod
    def _group_labels(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is not None and ALL_LABELS in value:
            if value != [ALL_LABELS]:
                raise ValueError("'...' (every label) must be the only group_by entry")
            return value
        _known(value or [], info)
        return value

    @field_validator("runbook_url")
    @classmethod
    def _runbook_template(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            check_link_template(value, info)
        return value

    @field_validator("receiver")
    @classmethod
    def _receiver_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        names = info.context.get("receivers") if isinstance(info.context, dict) else None
        if value is not None and names is not None and value not in names:
            raise ValueError(f"unknown receiver {value!r} (known: {', '.join(names)})")
        return value

    @property
    def all_matchers(self) -> tuple[Matcher, ...]:
        return (*globs(self.match), *self.matchers)


class Silence(_Strict):
    """Mute alerts whose labels match every matcher, from `starts_at` until `expires_at` (unix s).

    `matchers` is a list of matcher strings (`team="db"`, `stream=~"prod-.*"`) or the older
    mapping of label globs (`{stream: "prod-*"}`)."""

    matchers: Annotated[tuple[Matcher, ...], BeforeValidator(_silence_matchers)] = Field(min_length=1)
    expires_at: float
    starts_at: float = 0.0
    created_by: str = ""
    comment: str = ""
    id: str = ""  # set for silences stored in the outbox

    @model_validator(mode="before")
    @classmethod
    def _timestamps(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for field in ("expires_at", "starts_at"):
                if field in data:
                    data[field] = parse_time(data[field])
        return data

    @field_validator("matchers")
    @classmethod
    def _known_labels(cls, value: tuple[Matcher, ...], info: ValidationInfo) -> tuple[Matcher, ...]:
        _known([m.name for m in value], info)
        return value


class InhibitRule(_Strict):
    """Alertmanager's inhibition: while an alert matching `source_matchers` fires, alerts
    matching `target_matchers` that have the same values for the `equal` labels are not
    notified (e.g. a critical alert of a stream mutes its warnings)."""

    source_matchers: Matchers = Field(min_length=1)
    target_matchers: Matchers = Field(min_length=1)
    equal: list[str] = []

    @field_validator("source_matchers", "target_matchers")
    @classmethod
    def _matcher_labels(cls, value: tuple[Matcher, ...], info: ValidationInfo) -> tuple[Matcher, ...]:
        _known([m.name for m in value], info)
        return value

    @field_validator("equal")
    @classmethod
    def _equal_labels(cls, value: list[str], info: ValidationInfo) -> list[str]:
        _known(value, info)
        return value


# What a link template may use: {{stream}}, {{labels.team}} ... (see logstream.alerts.links)
LINK_VARIABLES = (
    "stream", "severity", "template", "template_text", "source", "model_id", "receiver",
    "starts_at", "ends_at", "from_ms", "to_ms", "from", "to", "dedup_key",
)  # fmt: skip


def check_link_template(template: str, info: ValidationInfo | None = None) -> None:
    """http(s) with a host, and only known `{{variables}}` (a typo would render empty)."""
    known = info.context.get("labels") if info is not None and isinstance(info.context, dict) else None
    labels = known if known is not None else LABEL_NAMES
    for name in TEMPLATE_VARIABLE.findall(template):
        if name.startswith("labels."):
            if name.removeprefix("labels.") not in labels:
                raise ValueError(f"unknown label in {{{{{name}}}}} (known: {', '.join(labels)})")
        elif name not in LINK_VARIABLES:
            raise ValueError(
                f"unknown variable {{{{{name}}}}} (known: {', '.join(LINK_VARIABLES)}, labels.NAME)"
            )
    check_url(TEMPLATE_VARIABLE.sub("x", template))


class Link(_Strict):
    """A link every alert carries (Grafana Explore, Kibana Discover ...): `url` is a template
    whose `{{variable}}`s are filled per alert, URL-encoded (see logstream.alerts.links)."""

    name: str = Field(min_length=1)
    url: str

    @field_validator("url")
    @classmethod
    def _template(cls, value: str, info: ValidationInfo) -> str:
        check_link_template(value, info)
        return value


class Backoff(_Strict):
    """Retry delay after failure n: uniform(d*(1-jitter), d), d = min(max, base*factor**(n-1))."""

    base: Duration = Field(default=1.0, gt=0)
    factor: float = Field(default=2.0, ge=1)
    max: Duration = Field(default=300.0, gt=0)
    jitter: float = Field(default=0.5, ge=0, le=1)


class DeliveryConfig(_Strict):
    """Outbox location, the retry policy shared by all channels, and the worker's limits.

    `min_retry_delay` floors every retry delay (a `Retry-After: 0` or a tiny
    backoff never turns into a request storm). `shutdown_grace` is how long
    closing the sink keeps delivering; keep it, plus serve's own shutdown
    grace, under the pod's terminationGracePeriodSeconds. What is not
    delivered by then stays in the outbox for the next process.
    """

    outbox: str = "var/alerts-outbox.sqlite"
    backoff: Backoff = Backoff()
    min_retry_delay: Duration = Field(default=1.0, ge=0)
    max_retry_after: Duration = Field(default=3600.0, gt=0)
    give_up_after: Duration = Field(default=86400.0, gt=0)
    concurrency: int = Field(default=8, gt=0)
    poll_interval: Duration = Field(default=0.5, gt=0)
    synchronous: Literal["full", "normal"] = "full"
    shutdown_grace: Duration = Field(default=10.0, ge=0)
    # how long an SQLite write waits for another writer's lock before it is an error
    lock_timeout: Duration = Field(default=30.0, gt=0)
    # delivered rows (and their attempts) are pruned after `retention`, dead letters after
    # `dead_retention` (kept longer: someone may want to replay them)
    retention: Duration = Field(default=7 * 86400.0, gt=0)
    dead_retention: Duration = Field(default=30 * 86400.0, gt=0)
    # a resolved group (an incident's state, ~10 KB with its context lines) is pruned when its
    # last anomaly is older than this and none of its deliveries is left; the next anomaly of
    # its key opens a new group, whose dedup key was never used (grouping.Group.incident)
    resolved_retention: Duration = Field(default=14 * 86400.0, gt=0)
    # a failed worker loop restarts after restart_delay, doubling per consecutive failure up
    # to restart_delay_max; after `unhealthy_after` consecutive failures healthy() is False
    restart_delay: Duration = Field(default=1.0, gt=0)
    restart_delay_max: Duration = Field(default=60.0, gt=0)
    unhealthy_after: int = Field(default=5, gt=0)


class Global(_Strict):
    """A group with no new anomaly for `resolve_timeout` is resolved."""

    resolve_timeout: Duration = Field(default=300.0, gt=0)


class AlertsConfig(_Strict):
    """The whole routes file."""

    global_: Global = Field(default=Global(), alias="global")
    # labels taken from the record (serve's input.label_fields / label_regex) that
    # matchers, group_by, inhibit rules, silences and link templates may use
    record_labels: list[str] = []
    route: Route
    receivers: list[Receiver] = Field(min_length=1)
    inhibit_rules: list[InhibitRule] = []
    # links every alert carries, e.g. a Grafana Explore link for the stream and time range
    links: list[Link] = []
    delivery: DeliveryConfig = DeliveryConfig()
    silences: list[Silence] = []
    # older releases kept `logstream silence` additions here; they are imported into the outbox
    silences_file: str | None = None

    @field_validator("record_labels")
    @classmethod
    def _label_names(cls, value: list[str]) -> list[str]:
        for name in value:
            check_record_label(name)
        return value

    @property
    def label_names(self) -> tuple[str, ...]:
        return (*LABEL_NAMES, *self.record_labels)

    def receiver(self, name: str) -> Receiver | None:
        return next((r for r in self.receivers if r.name == name), None)


def check_record_label(name: str) -> None:
    """A label taken from a record (routes `record_labels`, serve's `input.label_*`): a valid
    label name that does not replace a built-in one; ValueError otherwise."""
    if not is_label_name(name):
        raise ValueError(f"{name!r} is not a label name ([A-Za-z_][A-Za-z0-9_]*)")
    if name in LABEL_NAMES:
        raise ValueError(f"{name!r} is a built-in alert label; a record label cannot replace it")


def _context(data: dict[str, Any], secrets: bool) -> dict[str, Any]:
    """What field validators need from elsewhere in the file: receiver and label names."""
    receivers = data.get("receivers")
    names = (
        [r["name"] for r in receivers if isinstance(r, dict) and isinstance(r.get("name"), str)]
        if isinstance(receivers, list)
        else []
    )
    declared = data.get("record_labels")
    extra = [n for n in declared if isinstance(n, str)] if isinstance(declared, list) else []
    return {"receivers": names, "labels": (*LABEL_NAMES, *extra), "secrets": secrets}


def _file_problems(data: dict[str, Any]) -> list[str]:
    """Checks across fields (pydantic checks each field): duplicate receivers, a root receiver."""
    problems = []
    receivers = data.get("receivers")
    if isinstance(receivers, list):
        names = [r.get("name") for r in receivers if isinstance(r, dict)]
        dupes = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
        if dupes:
            problems.append(f"receivers: duplicate name(s) {', '.join(dupes)}")
    route = data.get("route")
    if isinstance(route, dict) and route.get("receiver") is None:
        problems.append("route.receiver: the root route needs a receiver")
    return problems


def parse_config(data: Any, *, source: str = "<alerts config>", secrets: bool = True) -> AlertsConfig:
    """Validate a decoded routes document; AlertConfigError lists every problem, each naming
    its field. `secrets=False` checks references' form without resolving them (no env, no
    files needed); such a config is for checking only, never for sending."""
    if not isinstance(data, dict):
        raise AlertConfigError(f"{source}: expected a mapping at the top level")
    problems = _file_problems(data)
    try:
        config = AlertsConfig.model_validate(data, context=_context(data, secrets))
    except ValidationError as exc:
        problems += describe_all(exc)
        config = None
    if problems or config is None:
        raise AlertConfigError(f"{source}: " + "; ".join(problems))
    return config


def describe_all(exc: ValidationError) -> list[str]:
    """Every validation error as 'field.path[0]: reason'."""
    out = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        reason = error["msg"].removeprefix("Value error, ")
        out.append(f"{where.lstrip('.')}: {reason}" if where else reason)
    return out


def describe(exc: ValidationError) -> str:
    """Every validation error, in one line: 'field.path[0]: reason; other.field: reason'."""
    return "; ".join(describe_all(exc))


def load_config(path: str | Path, *, secrets: bool = True) -> AlertsConfig:
    """Read and validate a routes file; any problem is one AlertConfigError line
    (every problem in it). `secrets=False`: see parse_config."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AlertConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise AlertConfigError(f"{path}:{line} not valid YAML") from None
    return parse_config(data, source=str(path), secrets=secrets)
