"""The serve settings: one model, read from a YAML file and `LOGSTREAM_*` env.

Precedence, highest first: environment (`LOGSTREAM_KAFKA__BOOTSTRAP_SERVERS=...`,
nested keys joined by `__`), then the YAML file, then the defaults below. The
Helm chart renders `configs/serve.yaml`-shaped YAML, so this model is also the
chart's config contract: `logstream serve --config FILE --check` validates one.

A wrong setting fails at start with `SettingsError`, one line per problem,
each naming the field (`kafka.topics`) and the reason.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from logstream.alerts.config import check_record_label
from logstream.errors import UserError
from logstream.memory.settings import IncidentMemorySettings
from logstream.regex import check_python_regex, compile_safe
from logstream.rotating import FILES, MAX_BYTES

_YAML_FILE: ContextVar[Path | None] = ContextVar("logstream_settings_yaml", default=None)

Port = Annotated[int, Field(ge=0, le=65535)]


class SettingsError(UserError):
    """Invalid serve settings; the message names each field and the reason."""


class _Section(BaseModel):
    """A settings section: unknown keys are errors (a typo must not be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSettings(_Section):
    """The trained model: a directory `logstream train` wrote, or a model store to follow."""

    dir: Path | None = None
    # Or a model store (logstream.lifecycle.model_store): serve loads its live version and hot-reloads
    # it when `logstream models promote|rollback` changes it (checked every reload_seconds).
    store: Path | None = None
    reload_seconds: float = Field(default=5.0, gt=0)
    # A candidate store version scored next to the live one on the same records; it never
    # pages (its anomalies go to metrics and the audit log only). Needs `store`.
    shadow: str | None = None
    # Scheduled candidates (logstream.lifecycle.candidate): every this many seconds (86400: nightly),
    # continue the live version on the latest unflagged lines and add it to the store as a
    # new version, never promoted. None = off. Needs `store`.
    candidate_every_seconds: float | None = Field(default=None, gt=0)
    candidate_min_lines: int = Field(default=5_000, gt=0)  # fewer kept lines: wait
    candidate_max_lines: int = Field(default=50_000, gt=0)  # the most recent ones are kept
    candidate_steps: int = Field(default=400, gt=0)  # training steps of a candidate
    device: str = "cpu"
    # Tokens kept in each stream's rolling window; None = the window it was trained with.
    window: int | None = Field(default=None, gt=0)
    # Streams whose KV cache is resident in the engine (its slots: memory = max_streams x the
    # per-stream cache); more streams evict the least recently used, re-encoded when they return.
    max_streams: int = Field(default=64, gt=0)
    # Keep each stream's K/V as int8 with per (token, kv head) scales: 1/4 of the ring's
    # memory, no line changed side of the threshold in benchmarks/ring_precision.py. CPU only.
    int8_ring: bool = False
    # torch intra-op threads on CPU; None = torch's default (one per core). A tiny or small
    # model on a busy CPU scores several times faster with 1 (see docs/serve.md).
    threads: int | None = Field(default=None, gt=0)
    # Sensitivity: the share of normal lines allowed to alert (scores are -log10 p, so the
    # threshold is -log10 of it); None = the rate saved with the model.
    false_alarm_rate: float | None = Field(default=None, gt=0, lt=1)
    # Or the threshold itself in -log10 p; overrides false_alarm_rate.
    threshold: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_model_source(self) -> ModelSettings:
        if (self.dir is None) == (self.store is None):
            raise ValueError("set exactly one of model.dir and model.store")
        if self.shadow is not None and self.store is None:
            raise ValueError("model.shadow names a store version: it needs model.store")
        if self.candidate_every_seconds is not None and self.store is None:
            raise ValueError("model.candidate_every_seconds adds versions to a store: it needs model.store")
        return self

    @model_validator(mode="after")
    def _int8_ring_on_cpu(self) -> ModelSettings:
        if self.int8_ring and self.device.startswith("cuda"):
            raise ValueError("model.int8_ring is CPU only: the Triton kernels do not read int8 yet")
        return self


class KafkaSettings(_Section):
    """The consumer group. Exactly one of `topics` and `topic_pattern` is set."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topics: list[str] = Field(default_factory=list)
    topic_pattern: str | None = None  # a regex over topic names, e.g. "logs\\..*"
    group_id: str = Field(default="logstream", min_length=1)
    client_id: str = "logstream"
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # Largest batch handed to the model at once.
    max_poll_records: int = Field(default=256, gt=0)
    fetch_timeout_ms: int = Field(default=500, gt=0)
    session_timeout_ms: int = Field(default=30_000, gt=0)
    heartbeat_interval_ms: int = Field(default=3_000, gt=0)
    max_poll_interval_ms: int = Field(default=300_000, gt=0)
    # Topic metadata refresh: a new topic matching topic_pattern is picked up within this.
    metadata_max_age_ms: int = Field(default=60_000, gt=0)
    # Bad messages are copied here (value, key, and a `logstream-reject` header) if set.
    dead_letter_topic: str | None = None
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None  # from env: LOGSTREAM_KAFKA__SASL_PASSWORD
    ssl_cafile: Path | None = None

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            check_python_regex(value)  # aiokafka matches it with `re`: no nested quantifiers
        return value

    @model_validator(mode="after")
    def _one_topic_source(self) -> KafkaSettings:
        if bool(self.topics) == (self.topic_pattern is not None):
            raise ValueError("set exactly one of kafka.topics and kafka.topic_pattern")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("kafka.heartbeat_interval_ms must be below session_timeout_ms")
        if self.sasl_mechanism and not (self.sasl_username and self.sasl_password):
            raise ValueError("kafka.sasl_mechanism needs sasl_username and sasl_password")
        return self


MULTILINE_MODES = ("off", "auto", "start", "continue")


class MultilineSettings(_Section):
    """Joining the lines of one event (a Java stack trace, a Python traceback) into one record
    (logstream/consumers/multiline.py).

    `auto` knows Java traces (`at ...`, `Caused by:`, `... N more`), Python tracebacks and
    indented continuation lines; `start` begins an event at each line matching `pattern`
    (every other line continues it); `continue` joins each line matching `pattern` to the
    event before it. Patterns run with RE2 and search the line (anchor them with `^`).
    Off by default in serve: a Kafka message is usually one event already (a log shipper
    joined it), and joining there cannot span two fetches (docs/serve.md). `logstream
    replay`, `tail` and `train` read files and stdin, where it is on (`--multiline auto`).
    """

    mode: Literal["off", "auto", "start", "continue"] = "off"
    pattern: str | None = None
    # An event is cut (and counted) at this many lines or bytes; the rest starts another one.
    max_lines: int = Field(default=200, gt=1)
    max_bytes: int = Field(default=16_384, gt=0)
    # A followed file or stdin: an event is complete once no line came for this long.
    flush_seconds: float = Field(default=0.5, gt=0)

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            compile_safe(value)  # RE2: runs on every untrusted line
        return value

    @model_validator(mode="after")
    def _pattern_for_its_mode(self) -> MultilineSettings:
        if self.mode in ("start", "continue") and not self.pattern:
            raise ValueError(f"multiline mode {self.mode} needs a pattern")
        if self.mode in ("off", "auto") and self.pattern:
            raise ValueError(f"multiline mode {self.mode} takes no pattern (use start or continue)")
        return self


class InputSettings(_Section):
    """How a message becomes a LogRecord: its format and its stream key.

    `format: json` reads the line from `message_field` (a dotted path, e.g.
    `log.message`), as Vector, Fluent Bit or Filebeat send records.
    `stream_key` picks the stream: the Kafka message key, a JSON field
    (`stream_field`), a regex capture on the line (`stream_regex`, group 1 or
    the whole match), or none (every line in `default_stream`).
    """

    format: Literal["plain", "json"] = "plain"
    message_field: str = Field(default="message", min_length=1)
    stream_key: Literal["message_key", "json_field", "regex", "none"] = "message_key"
    stream_field: str | None = None
    stream_regex: str | None = None
    default_stream: str = Field(default="default", min_length=1)
    # Larger messages are rejected as "oversized" (counted, never scored).
    max_message_bytes: int = Field(default=65_536, gt=0)
    # Labels for alert routing taken from the record (declare them in the routes file's
    # record_labels): label -> JSON field (dotted path; format json), and/or a regex on the
    # line whose named groups are labels, e.g. 'ns=(?P<namespace>[a-z0-9-]+)'.
    label_fields: dict[str, str] = Field(default_factory=dict)
    label_regex: str | None = None
    # format json: the field with the event time (RFC 3339 or unix s/ms); alerts start at it.
    # Without it (or when a record lacks it) Kafka's message timestamp is used.
    timestamp_field: str | None = None
    # Multi-line events (stack traces) joined into one record; off for Kafka (see the class).
    multiline: MultilineSettings = MultilineSettings()

    @field_validator("stream_regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            compile_safe(value)  # RE2: runs on untrusted lines, so it must not backtrack
        return value

    @field_validator("label_regex")
    @classmethod
    def _label_regex_has_names(cls, value: str | None) -> str | None:
        if value is not None:
            names = list(compile_safe(value).groupindex)
            if not names:
                raise ValueError("label_regex needs named groups, e.g. (?P<namespace>[a-z0-9-]+)")
            _check_label_names(names)
        return value

    @field_validator("label_fields")
    @classmethod
    def _label_field_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_label_names(list(value))
        return value

    @model_validator(mode="after")
    def _key_source_is_configured(self) -> InputSettings:
        if self.stream_key == "json_field" and (self.format != "json" or not self.stream_field):
            raise ValueError("stream_key json_field needs format json and stream_field")
        if self.stream_key == "regex" and not self.stream_regex:
            raise ValueError("stream_key regex needs stream_regex")
        if (self.label_fields or self.timestamp_field) and self.format != "json":
            raise ValueError(
                "label_fields and timestamp_field need format json (use label_regex on plain lines)"
            )
        return self


def _check_label_names(names: list[str]) -> None:
    for name in names:
        check_record_label(name)


class SinkSettings(_Section):
    """Where anomalies are handed off; offsets are committed after `put` returns.

    `alerts`: the alert pipeline (routes file -> SQLite outbox -> notifiers; the
    outbox path is the routes file's `delivery.outbox`). `jsonl`: append to `path`.
    """

    kind: Literal["alerts", "jsonl"] = "jsonl"
    path: Path = Path("anomalies.jsonl")
    # kind jsonl: the file rotates at max_bytes (path.1, path.2, ...), at most `files` kept
    max_bytes: int = Field(default=MAX_BYTES, gt=0)
    files: int = Field(default=FILES, gt=0)
    routes: Path | None = None  # kind alerts: the routes file, e.g. configs/alerts.yaml

    @model_validator(mode="after")
    def _alerts_need_routes(self) -> SinkSettings:
        if self.kind == "alerts" and self.routes is None:
            raise ValueError("sink kind alerts needs sink.routes (a routes file)")
        return self


class StateSettings(_Section):
    """Stream state across rebalances and restarts, and streams without any (docs/serve.md).

    `changelog_topic`: a compacted topic (created if missing) that keeps each stream's last
    tokens and counters, written before offsets are committed and read when a partition is
    assigned, so the stream's new owner resumes with its context. None = off (cold restarts).
    """

    changelog_topic: str | None = Field(default=None, min_length=1)
    # Partitions when serve creates it; None = as many as the input topic with the most.
    changelog_partitions: int | None = Field(default=None, gt=0)
    # Replication factor when serve creates it; -1 = the broker's default.
    changelog_replication: int = Field(default=-1, ge=-1)
    # With a changelog, offsets are committed (each after the changelog write that covers
    # them) at most this often: a stream is written once per interval, whatever its lines.
    changelog_interval_seconds: float = Field(default=5.0, ge=0)
    # A restore whose read takes longer gives up (logged): those streams start cold.
    restore_timeout_seconds: float = Field(default=120.0, gt=0)
    # Cold start: a stream with fewer scored lines than this (restored ones count) raises no
    # alert; its lines are still scored and fill its context. 0 = alert from the first line.
    min_context_lines: int = Field(default=0, ge=0)
    # ... or, if set, alerts only above this stricter threshold (-log10 p) until then.
    cold_threshold: float | None = Field(default=None, ge=0)


class RepartitionSettings(_Section):
    """Affinity when producers do not key by stream (docs/serve.md "Repartitioning").

    With `topic` set, a stage reads `kafka.topics` (the raw topic), takes each message's
    stream key as `input` says and produces the message unchanged to `topic` keyed by it
    (idempotent, acks=all; its input is committed only once the copies are acknowledged);
    the scorer then consumes `topic` with the message key as the stream.
    """

    topic: str | None = Field(default=None, min_length=1)
    # Run the stage inside `logstream serve` too (else: `logstream serve --role repartition`).
    in_process: bool = True
    group_id: str = Field(default="logstream-repartition", min_length=1)
    # Partitions when serve creates the topic; None = as many as the raw topic with the most.
    partitions: int | None = Field(default=None, gt=0)


class HttpSettings(_Section):
    """/healthz, /readyz and /metrics; the limits also bound the feedback port."""

    host: str = "0.0.0.0"  # a pod must answer its kubelet's probes
    port: Port = 8080
    # Each socket read of a request waits at most this long (a half-sent request is dropped).
    timeout_seconds: float = Field(default=10.0, gt=0)
    # Requests handled at once per port (a thread each); a connection beyond gets 503 at once.
    max_connections: int = Field(default=16, gt=0, le=1024)


class FeedbackSettings(_Section):
    """Operator feedback (logstream.lifecycle.feedback): where verdicts live, who may POST them, and where."""

    # The feedback database; None = the routes file's outbox (sink kind alerts), else off.
    # One file per pod: SQLite's locks do not work across hosts (docs/lifecycle.md "Replicas").
    database: Path | None = None
    # POST /feedback has a port of its own (the metrics port stays read-only); None = no
    # endpoint (verdicts by `logstream feedback` only). configs/serve.yaml sets 8081.
    host: str = "0.0.0.0"
    port: Port | None = None
    # How often scoring re-reads the verdicts (the CLI's and other processes').
    refresh_seconds: float = Field(default=5.0, gt=0)
    # Who may POST: a file of "name:token" lines, one per operator or integration; the name
    # is stored as the verdict's author (the caller cannot choose it).
    tokens_file: Path | None = None
    # Without tokens POST /feedback answers 403, unless this opens it (a trusted network only;
    # verdicts are then stored as by "anonymous", with the caller's address).
    allow_without_token: bool = False
    # Verdicts expired, or replaced for good, longer ago than this are deleted.
    retention_days: float = Field(default=90.0, gt=0)


class ServeSettings(BaseSettings):
    """Everything `logstream serve` reads. Sections: model, kafka, input, sink, http, state,
    repartition, feedback, incidents."""

    model_config = SettingsConfigDict(
        env_prefix="LOGSTREAM_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    model: ModelSettings
    kafka: KafkaSettings
    input: InputSettings = InputSettings()
    sink: SinkSettings = SinkSettings()
    http: HttpSettings = HttpSettings()
    state: StateSettings = StateSettings()
    repartition: RepartitionSettings = RepartitionSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    # The incident memory (sink kind alerts: in the outbox file), which gives each alert the
    # past incidents most like it: what it keeps and for how long, how it ranks, its links
    # (logstream.memory.settings; docs/incident_memory.md).
    incidents: IncidentMemorySettings = IncidentMemorySettings()
    # Lines fetched but not yet committed; above it partitions are paused.
    max_inflight_lines: int = Field(default=2_048, gt=0)
    # SIGTERM/SIGINT: time to finish the batch, commit and leave the group.
    shutdown_grace_seconds: float = Field(default=20.0, gt=0)
    # A stream quiet this long is closed and gets its end-of-stream score; None = never.
    stream_idle_seconds: float | None = Field(default=None, gt=0)
    # Alert when a source of a stream (syslog program, log4j logger) stops logging for longer
    # than its rhythm allows (logstream/scoring/quiet.py), at the line threshold.
    quiet_sources: bool = True
    # Streams tracked for stream_idle_seconds. Past it the least recently seen one is forgotten
    # (not closed: it gets no end score), so memory stays bounded under any number of keys.
    max_tracked_streams: int = Field(default=100_000, gt=0)
    # One JSON line per scored line (source, offset, stream, score), fsynced before commit.
    audit_log: Path | None = None
    # The audit log rotates: a file is closed at this size (it becomes audit_log.1, the one
    # before .2, ...) and at most audit_log_files are kept, the current one included, so it
    # never holds more than their product (default 8 x 64 MiB = 512 MiB).
    audit_log_max_bytes: int = Field(default=MAX_BYTES, gt=0)
    audit_log_files: int = Field(default=FILES, gt=0)
    # /healthz fails when the consumer holds partitions but no fetch completed for this long
    # (a rebalance callback or the scorer stuck), so the liveness probe restarts the pod. A
    # restore and the drain before a revoke hold fetching legitimately: keep it above
    # state.restore_timeout_seconds and the time to score max_inflight_lines.
    fetch_stall_seconds: float = Field(default=300.0, gt=0)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _ports_differ(self) -> ServeSettings:
        if self.feedback.port == self.http.port and self.feedback.port:
            raise ValueError("feedback.port must differ from http.port (feedback has a port of its own)")
        return self

    @model_validator(mode="after")
    def _stall_outlasts_a_restore(self) -> ServeSettings:
        if self.fetch_stall_seconds * 1000 <= self.kafka.fetch_timeout_ms:
            raise ValueError(
                "fetch_stall_seconds must exceed kafka.fetch_timeout_ms: one fetch waits that long"
            )
        if self.state.changelog_topic and self.fetch_stall_seconds <= self.state.restore_timeout_seconds:
            raise ValueError(
                "fetch_stall_seconds must exceed state.restore_timeout_seconds: a restore holds fetching that long"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = _YAML_FILE.get()
        sources = [init_settings, env_settings]
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "settings"
        reason = error["msg"].removeprefix("Value error, ")
        problems.append(f"{field}: {reason}")
    return "invalid settings: " + "; ".join(problems)


def load_settings(path: Path | str | None = None) -> ServeSettings:
    """Read YAML at `path` (if any) under `LOGSTREAM_*` env; raise SettingsError if wrong."""
    yaml_file = None if path is None else Path(path)
    if yaml_file is not None:
        if not yaml_file.is_file():
            raise SettingsError(f"config file not found: {yaml_file}")
        try:
            content = yaml.safe_load(yaml_file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise SettingsError(f"{yaml_file}: not valid YAML: {exc}".replace("\n", " ")) from None
        if content is not None and not isinstance(content, dict):
            raise SettingsError(f"{yaml_file}: the top level must be a mapping of sections")
    token = _YAML_FILE.set(yaml_file)
    try:
        return ServeSettings()
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    finally:
        _YAML_FILE.reset(token)


def json_schema() -> dict[str, Any]:
    """The JSON schema of the serve config (for the Helm chart's values.schema.json)."""
    return ServeSettings.model_json_schema()
