"""Serve settings: YAML + LOGSTREAM_* env, and one clear error naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from logstream.settings import InputSettings, SettingsError, load_settings

REPO = Path(__file__).resolve().parents[1]
MINIMAL = "model: {dir: runs/model}\nkafka: {topics: [logs]}\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_yaml_values_are_read(tmp_path: Path) -> None:
    """Values in the YAML file reach the nested sections."""
    path = _write(tmp_path, MINIMAL + "input: {format: json, message_field: log.message}\n")
    settings = load_settings(path)
    assert settings.kafka.topics == ["logs"]
    assert settings.input.message_field == "log.message"
    assert settings.model.dir == Path("runs/model")


def test_env_overrides_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LOGSTREAM_SECTION__FIELD beats the YAML file; other YAML fields survive."""
    path = _write(tmp_path, MINIMAL.replace("[logs]", "[logs], group_id: from-yaml"))
    monkeypatch.setenv("LOGSTREAM_KAFKA__GROUP_ID", "from-env")
    monkeypatch.setenv("LOGSTREAM_HTTP__PORT", "9109")
    settings = load_settings(path)
    assert settings.kafka.group_id == "from-env"
    assert settings.kafka.topics == ["logs"]
    assert settings.http.port == 9109


def test_engine_slots_from_yaml_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.max_streams (the engine's resident streams) defaults to 64, is read from the
    YAML file, and LOGSTREAM_MODEL__MAX_STREAMS overrides it; model.int8_ring likewise (off)."""
    assert load_settings(_write(tmp_path, MINIMAL)).model.max_streams == 64
    path = _write(tmp_path, MINIMAL.replace("runs/model", "runs/model, max_streams: 256"))
    assert load_settings(path).model.max_streams == 256
    monkeypatch.setenv("LOGSTREAM_MODEL__MAX_STREAMS", "1024")
    assert load_settings(path).model.max_streams == 1024
    assert not load_settings(path).model.int8_ring
    monkeypatch.setenv("LOGSTREAM_MODEL__INT8_RING", "true")
    assert load_settings(path).model.int8_ring


def test_secret_is_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SASL password from env never appears in the settings' repr."""
    text = MINIMAL.replace("[logs]", "[logs], sasl_mechanism: PLAIN, sasl_username: u")
    monkeypatch.setenv("LOGSTREAM_KAFKA__SASL_PASSWORD", "hunter2-secret")
    settings = load_settings(_write(tmp_path, text))
    assert "hunter2-secret" not in repr(settings)
    assert settings.kafka.sasl_password.get_secret_value() == "hunter2-secret"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("model: {dir: m}\nkafka: {}\n", "kafka", "exactly one of kafka.topics"),
        (MINIMAL + "http: {port: 70000}\n", "http.port", "less than or equal to 65535"),
        (MINIMAL + "kafka2: {}\n", "kafka2", "Extra inputs are not permitted"),
        (
            MINIMAL.replace("[logs]", "[logs], max_poll_records: 0"),
            "kafka.max_poll_records",
            "greater than 0",
        ),
        (
            MINIMAL + "input: {stream_key: regex, stream_regex: 'a('}\n",
            "input.stream_regex",
            "not a valid regex",
        ),
        (
            MINIMAL + "input: {stream_key: regex, stream_regex: '(a)\\1'}\n",
            "input.stream_regex",
            "backreferences and lookaround",
        ),
        (
            "model: {dir: m}\nkafka: {topic_pattern: '(a+)+$'}\n",
            "kafka.topic_pattern",
            "nested quantifiers",
        ),
        (
            "model: {dir: m}\nkafka: {topic_pattern: 'logs-(?=x)'}\n",
            "kafka.topic_pattern",
            "backreferences and lookaround",
        ),
        (MINIMAL + "max_tracked_streams: 0\n", "max_tracked_streams", "greater than 0"),
        (MINIMAL.replace("runs/model", "runs/model, max_streams: 0"), "model.max_streams", "greater than 0"),
        (
            MINIMAL.replace("runs/model", "runs/model, device: cuda, int8_ring: true"),
            "model",
            "int8_ring is CPU only",
        ),
        (
            MINIMAL + "input: {stream_key: json_field}\n",
            "input",
            "needs format json and stream_field",
        ),
        ("kafka: {topics: [logs]}\n", "model", "Field required"),
        (MINIMAL + "sink: {kind: alerts}\n", "sink", "needs sink.routes"),
        (MINIMAL + "audit_log_files: 0\n", "audit_log_files", "greater than 0"),
        (MINIMAL + "incidents: {k: 0}\n", "incidents.k", "greater than 0"),
        (MINIMAL + "incidents: {retention: soon}\n", "incidents.retention", "not a duration"),
        (
            MINIMAL + "incidents: {link: 'https://wiki.example/{{stream}}'}\n",
            "incidents.link",
            "{{fingerprint}} and no other variable",
        ),
        (
            MINIMAL + "incidents: {link: 'file:///incidents/{{fingerprint}}'}\n",
            "incidents.link",
            "scheme 'file' is not allowed",
        ),
        (
            MINIMAL + "fetch_stall_seconds: 60\nstate: {changelog_topic: c, restore_timeout_seconds: 120}\n",
            "settings",
            "fetch_stall_seconds must exceed state.restore_timeout_seconds",
        ),
    ],
)
def test_invalid_setting_names_field_and_reason(tmp_path: Path, text: str, field: str, reason: str) -> None:
    """A wrong setting fails with one line that names the field and says why."""
    with pytest.raises(SettingsError) as caught:
        load_settings(_write(tmp_path, text))
    message = str(caught.value)
    assert f"{field}: " in message
    assert reason in message
    assert "\n" not in message


def test_bad_env_value_names_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong value from env is reported like one from the file."""
    monkeypatch.setenv("LOGSTREAM_SHUTDOWN_GRACE_SECONDS", "soon")
    with pytest.raises(SettingsError, match="shutdown_grace_seconds: "):
        load_settings(_write(tmp_path, MINIMAL))


def test_missing_file_and_non_mapping_are_clear(tmp_path: Path) -> None:
    """A missing config file or a YAML list at the top level is one clear error."""
    with pytest.raises(SettingsError, match="config file not found"):
        load_settings(tmp_path / "nope.yaml")
    with pytest.raises(SettingsError, match="top level must be a mapping"):
        load_settings(_write(tmp_path, "- a\n- b\n"))


def test_shipped_default_config_is_valid() -> None:
    """configs/serve.yaml (the documented default) passes validation."""
    settings = load_settings(REPO / "configs" / "serve.yaml")
    assert settings.kafka.group_id


def test_nested_quantifier_in_stream_regex_is_accepted() -> None:
    """stream_regex runs on RE2 (linear time), so `(a+)+$` is safe there and accepted."""
    settings = InputSettings(stream_key="regex", stream_regex=r"(a+)+$")
    assert settings.stream_regex == r"(a+)+$"


def test_serve_check_refuses_a_backtracking_topic_pattern(tmp_path: Path) -> None:
    """`serve --check` exits 2 naming kafka.topic_pattern for a pattern with nested quantifiers."""
    config = _write(tmp_path, "model: {dir: m}\nkafka: {topic_pattern: 'logs-(\\w+)*$'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "serve", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("LOGSTREAM_")},
    )
    assert result.returncode == 2
    assert "kafka.topic_pattern: nested quantifiers" in result.stderr
    assert "Traceback" not in result.stderr
