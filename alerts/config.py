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
    model_validator,
)

# Labels an anomaly carries (see routing.anomaly_labels); `match` and silences may use these.
LABEL_NAMES = ("stream", "severity", "kind", "level", "template", "source", "model_id")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SECRET_FILE_MAX_BYTES = 64 * 1024


class AlertConfigError(ValueError):
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


def resolve_secret(value: Any) -> str:
    """Resolve `file:/path` and `${ENV}` references; the value itself never appears in errors."""
    if not isinstance(value, str):
        raise ValueError("must be a string, `${ENV_VAR}` or `file:/path`")
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


def _check_url(url: str, *, https_only: bool = False) -> None:
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


def _secret_url(value: SecretStr) -> SecretStr:
    _check_url(value.get_secret_value())
    return value


def _http_url(value: str) -> str:
    _check_url(value)
    return value


def _https_url(value: str) -> str:
    _check_url(value, https_only=True)
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]
SecretURL = Annotated[SecretStr, BeforeValidator(resolve_secret), AfterValidator(_secret_url)]
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


class Route(_Strict):
    """One node of the route tree; unset fields inherit from the parent."""

    receiver: str | None = None
    match: dict[str, str] = {}
    min_score: float | None = None
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    continue_: bool = Field(default=False, alias="continue")
    routes: list[Route] = []

    @model_validator(mode="after")
    def _known_labels(self) -> Route:
        for name in [*self.match, *(self.group_by or [])]:
            if name not in LABEL_NAMES:
                raise ValueError(f"unknown label {name!r} (known: {', '.join(LABEL_NAMES)})")
        return self


class Silence(_Strict):
    """Mute alerts whose labels match every glob in `matchers` until `expires_at` (unix s)."""

    matchers: dict[str, str] = Field(min_length=1)
    expires_at: float
    starts_at: float = 0.0
    created_by: str = ""
    comment: str = ""

    @model_validator(mode="before")
    @classmethod
    def _timestamps(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for field in ("expires_at", "starts_at"):
                if field in data:
                    data[field] = parse_time(data[field])
        return data

    @model_validator(mode="after")
    def _known_labels(self) -> Silence:
        for name in self.matchers:
            if name not in LABEL_NAMES:
                raise ValueError(f"unknown label {name!r} (known: {', '.join(LABEL_NAMES)})")
        return self


class Backoff(_Strict):
    """Retry delay after failure n: uniform(d*(1-jitter), d), d = min(max, base*factor**(n-1))."""

    base: Duration = Field(default=1.0, gt=0)
    factor: float = Field(default=2.0, ge=1)
    max: Duration = Field(default=300.0, gt=0)
    jitter: float = Field(default=0.5, ge=0, le=1)


class Delivery(_Strict):
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
    route: Route
    receivers: list[Receiver] = Field(min_length=1)
    delivery: Delivery = Delivery()
    silences: list[Silence] = []
    silences_file: str | None = None

    @model_validator(mode="after")
    def _receivers_exist(self) -> AlertsConfig:
        names = [r.name for r in self.receivers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"receivers: duplicate name(s) {', '.join(dupes)}")
        if self.route.receiver is None:
            raise ValueError("route.receiver: the root route needs a receiver")
        for path, node in _walk(self.route, "route"):
            if node.receiver is not None and node.receiver not in names:
                raise ValueError(
                    f"{path}.receiver: unknown receiver {node.receiver!r} (known: {', '.join(names)})"
                )
        return self

    def receiver(self, name: str) -> Receiver | None:
        return next((r for r in self.receivers if r.name == name), None)


def _walk(node: Route, path: str) -> list[tuple[str, Route]]:
    out = [(path, node)]
    for i, child in enumerate(node.routes):
        out += _walk(child, f"{path}.routes[{i}]")
    return out


def parse_config(data: Any, *, source: str = "<alerts config>") -> AlertsConfig:
    """Validate a decoded routes document; raise AlertConfigError naming the field."""
    if not isinstance(data, dict):
        raise AlertConfigError(f"{source}: expected a mapping at the top level")
    try:
        return AlertsConfig.model_validate(data)
    except ValidationError as exc:
        raise AlertConfigError(f"{source}: {describe(exc)}") from None


def describe(exc: ValidationError) -> str:
    """The first validation error as 'field.path[0]: reason (and N more)'."""
    first = exc.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    reason = first["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    prefix = f"{where.lstrip('.')}: " if where else ""
    return f"{prefix}{reason}{more}"


def load_config(path: str | Path) -> AlertsConfig:
    """Read and validate a routes file; any problem is one AlertConfigError line."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AlertConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise AlertConfigError(f"{path}:{line} not valid YAML") from None
    return parse_config(data, source=str(path))
