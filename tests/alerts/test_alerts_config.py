"""The routes file: good files load with secrets resolved; bad ones fail at load, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from alerts_support import alerts_cli, webhook, write_routes

from logstream.alerts.config import AlertConfigError, load_config, parse_duration

REPO = Path(__file__).resolve().parents[2]


def _edited(tmp_path: Path, edit: dict[str, object]) -> Path:
    """A valid routes file with top-level keys replaced by `edit`."""
    path = write_routes(tmp_path, [webhook("team", "http://127.0.0.1:9")])
    doc = yaml.safe_load(path.read_text())
    doc.update(edit)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_shipped_example_loads_with_env_and_file_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/alerts.yaml loads once its ${ENV} and file: secrets exist; values stay masked."""
    key_file = tmp_path / "pd-key"
    key_file.write_text("PDKEY123\n")
    text = (REPO / "configs/alerts.yaml").read_text()
    text = text.replace("/etc/logstream/secrets/pagerduty-routing-key", str(key_file))
    (tmp_path / "alerts.yaml").write_text(text)
    monkeypatch.setenv("LOGSTREAM_WEBHOOK_URL", "http://127.0.0.1:1/hook")
    monkeypatch.setenv("LOGSTREAM_SLACK_WEBHOOK_URL", "http://127.0.0.1:1/slack")
    config = load_config(tmp_path / "alerts.yaml")
    pd = config.receiver("oncall-pager").pagerduty_configs[0]  # type: ignore[union-attr]
    assert pd.routing_key.get_secret_value() == "PDKEY123"
    assert "PDKEY123" not in repr(config)
    assert [r.receiver for r in config.route.routes] == ["oncall-pager", "team-slack", "team-slack"]
    assert len(config.inhibit_rules) == 1 and [link.name for link in config.links] == ["Logs in Grafana"]


def test_local_example_loads() -> None:
    """configs/alerts-local.yaml (no secrets) is valid as shipped."""
    assert load_config(REPO / "configs/alerts-local.yaml").receivers[0].name == "local"


def test_unknown_receiver_names_the_route(tmp_path: Path) -> None:
    """A route pointing at a receiver that does not exist fails with its path and the known ones."""
    path = _edited(tmp_path, {"route": {"receiver": "team", "routes": [{"receiver": "pager"}]}})
    with pytest.raises(
        AlertConfigError,
        match=r"route\.routes\[0\]\.receiver: unknown receiver 'pager' \(known: team\)",
    ):
        load_config(path)


def test_unknown_channel_type_is_rejected(tmp_path: Path) -> None:
    """A channel kind we do not have (email_configs) is an error naming the field, not ignored."""
    path = _edited(tmp_path, {"receivers": [{"name": "team", "email_configs": [{"to": "x"}]}]})
    with pytest.raises(
        AlertConfigError, match=r"receivers\[0\]\.email_configs: Extra inputs are not permitted"
    ):
        load_config(path)


def test_unknown_match_label_is_rejected(tmp_path: Path) -> None:
    """`match` on a label anomalies do not carry fails at load and lists the known labels."""
    path = _edited(tmp_path, {"route": {"receiver": "team", "routes": [{"match": {"host": "a"}}]}})
    with pytest.raises(AlertConfigError, match=r"unknown label 'host' \(known: stream, severity"):
        load_config(path)


def test_bad_duration_is_rejected(tmp_path: Path) -> None:
    """A duration that does not parse names its field."""
    path = _edited(tmp_path, {"route": {"receiver": "team", "group_wait": "soon"}})
    with pytest.raises(AlertConfigError, match=r"route\.group_wait: not a duration: 'soon'"):
        load_config(path)


def test_missing_secret_env_var_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `${VAR}` that is not set fails at load naming the variable."""
    monkeypatch.delenv("NOT_SET_HOOK", raising=False)
    path = _edited(tmp_path, {"receivers": [webhook("team", "${NOT_SET_HOOK}")]})
    with pytest.raises(AlertConfigError, match="environment variable NOT_SET_HOOK is not set"):
        load_config(path)


def test_invalid_yaml_gives_the_line(tmp_path: Path) -> None:
    """Broken YAML is one error with the file and line."""
    path = tmp_path / "alerts.yaml"
    path.write_text("route:\n  receiver: [a\n")
    with pytest.raises(AlertConfigError, match=r"alerts\.yaml: line \d+ not valid YAML"):
        load_config(path)


def test_cli_check_reports_errors_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m logstream.alerts check` on a bad file: exit 2, one line on stderr."""
    path = _edited(tmp_path, {"route": {"receiver": "nobody"}})
    assert alerts_cli(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown receiver 'nobody'" in err


def test_durations_parse_alertmanager_style() -> None:
    """'500ms', '1h30m', '1d' and plain numbers are seconds."""
    assert [parse_duration(v) for v in ("500ms", "1h30m", "1d", 45)] == [0.5, 5400.0, 86400.0, 45.0]


def test_receiver_url_must_be_http_or_https(tmp_path: Path) -> None:
    """A `gopher://` webhook URL fails at load naming the field and the scheme."""
    path = _edited(tmp_path, {"receivers": [webhook("team", "gopher://127.0.0.1:70")]})
    with pytest.raises(
        AlertConfigError,
        match=r"receivers\[0\]\.webhook_configs\[0\]\.url: URL scheme 'gopher' is not allowed",
    ):
        load_config(path)


def test_pagerduty_url_must_be_https(tmp_path: Path) -> None:
    """PagerDuty over plain http to a remote host is refused (routing keys travel in the body)."""
    pd = {"name": "pd", "pagerduty_configs": [{"routing_key": "K", "url": "http://events.example.com/x"}]}
    path = _edited(tmp_path, {"route": {"receiver": "pd"}, "receivers": [pd]})
    with pytest.raises(AlertConfigError, match=r"pagerduty_configs\[0\]\.url: URL must be https"):
        load_config(path)


def test_file_url_is_not_a_secret_reference(tmp_path: Path) -> None:
    """`file:///etc/passwd` as a URL is refused as a file:// URL; the file is not read
    (its contents appear nowhere in the error)."""
    path = _edited(
        tmp_path, {"receivers": [{"name": "team", "webhook_configs": [{"url": "file:///etc/passwd"}]}]}
    )
    with pytest.raises(AlertConfigError, match="file:// URLs are not secret references") as raised:
        load_config(path)
    assert "root:" not in str(raised.value)


def test_secret_file_contents_never_reach_the_error(tmp_path: Path) -> None:
    """`file:/path` (the documented mechanism) holding something that is not a URL: the
    error names the field and the reason, not the file's text."""
    secret = tmp_path / "hook-url"
    secret.write_text("gopher://hidden-T0KEN@example.com\n")
    path = _edited(
        tmp_path, {"receivers": [{"name": "team", "webhook_configs": [{"url": f"file:{secret}"}]}]}
    )
    with pytest.raises(AlertConfigError, match=r"webhook_configs\[0\]\.url: URL scheme 'gopher'") as raised:
        load_config(path)
    assert "T0KEN" not in str(raised.value)


def test_secret_file_must_be_an_absolute_regular_file(tmp_path: Path) -> None:
    """A relative `file:` path is refused (it would depend on the working directory)."""
    path = _edited(tmp_path, {"receivers": [{"name": "team", "webhook_configs": [{"url": "file:hook-url"}]}]})
    with pytest.raises(AlertConfigError, match="secret file must be an absolute path"):
        load_config(path)


@pytest.mark.parametrize("routes", sorted((REPO / "configs").glob("alerts*.yaml")), ids=lambda p: p.name)
def test_the_example_routes_page_only_on_critical(routes: Path) -> None:
    """In the shipped routes files only a critical anomaly reaches a paging receiver
    (PagerDuty, Alertmanager): a warning goes to chat or a webhook at most, whatever its
    stream or team; a critical one on a production stream does page (configs/alerts.yaml)."""
    from logstream.alerts.routing import route

    config = load_config(routes, secrets=False)
    paging = {r.name for r in config.receivers if r.pagerduty_configs or r.alertmanager_configs}

    def receivers(severity: str, stream: str, team: str) -> set[str]:
        labels = {"stream": stream, "severity": severity, "kind": "line", "level": "error", "template": "0" * 12,
                  "source": "logs/0", "model_id": "m", "team": team, "namespace": ""}  # fmt: skip
        return {match.receiver for match in route(config, labels, score=99.0)}

    streams, teams = ("prod-api", "prod-db-1", "dev-web", "default"), ("storage", "payments", "")
    assert not any(receivers("warning", s, t) & paging for s in streams for t in teams)
    assert bool(receivers("critical", "prod-api", "")) and (
        not paging or receivers("critical", "prod-api", "") & paging
    )
