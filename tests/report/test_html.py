"""`logstream replay --report`: one self-contained HTML file, opened in a real headless Chromium.

`.ci/chromium.sh` installs Debian's chromium. Without it the browser tests skip with that hint,
except in CI (CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import NoReturn

import pytest
from alerts_support import webhook, write_routes
from cli_support import logstream

from logstream.evaluation.synth import INCIDENT_KINDS, STREAM_KEY, generate_lines

WINDOW = (1200, 1600)


def _missing(what: str) -> NoReturn:
    """Skip for a missing browser, except in CI (CI=true), where it is a failure."""
    message = f"{what} not installed: run .ci/chromium.sh"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _missing("chromium is")
    return found


@pytest.fixture(scope="module")
def replayed(synthetic_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A labelled incident log (each kind twice) replayed with --report and --alerts (an
    incident resolves after 10 s of the log's time, so each kind's second occurrence is an
    incident of its own); returns the report and the JSON summary."""
    tmp = tmp_path_factory.mktemp("report")
    log = generate_lines(800, seed=7, incidents=INCIDENT_KINDS * 2)
    (tmp / "incidents.log").write_text("\n".join(log.lines) + "\n")
    (tmp / "labels.txt").write_text("\n".join(map(str, log.labels)) + "\n")
    report = tmp / "report.html"
    routes = write_routes(
        tmp, [webhook("hook", "http://127.0.0.1:9")], **{"global": {"resolve_timeout": "10s"}}
    )
    result = logstream(
        "replay", tmp / "incidents.log", "--model", synthetic_model_dir, "--stream-key", STREAM_KEY,
        "--labels", tmp / "labels.txt", "--false-alarm-rate", "5e-3", "--report", report, "--json",
        "--alerts", routes,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return report, json.loads(result.stdout)


class _Dom(HTMLParser):
    """The elements of a dumped DOM that the checks need: tag, attributes and text per element."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        text: list[str] = []
        self.elements.append((tag, {k: v or "" for k, v in attrs}, text))
        if tag not in ("meta", "line", "br", "img", "polyline", "circle"):
            self._open.append(text)

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag not in ("meta", "line", "br", "img", "polyline", "circle"):
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for text in self._open:
            text.append(data)

    def find(self, tag: str, cls: str | None = None) -> list[tuple[dict[str, str], str]]:
        return [
            (attrs, "".join(text))
            for t, attrs, text in self.elements
            if t == tag and (cls is None or cls in attrs.get("class", "").split())
        ]


def _chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp / 'profile'}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_report_is_self_contained(replayed: tuple[Path, dict]) -> None:
    """The page loads nothing from anywhere: no URL, no external script, stylesheet or image."""
    page = replayed[0].read_text()
    assert not re.search(r"https?://|//cdn|<link\b|\bsrc=|@import|url\(", page)


def test_report_in_chromium_shows_the_anomalies(
    chromium: str, replayed: tuple[Path, dict], tmp_path: Path
) -> None:
    """Chromium renders the report: one row per anomaly group, one marker per anomaly on the
    timelines, the surprising words of each group's worst line marked, precision/recall from
    the labels."""
    report, summary = replayed
    dumped = _chromium(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _Dom()
    dom.feed(dumped.stdout)
    assert summary["anomalies"] > 0 and summary["streams"] <= 12  # every stream has a timeline
    assert len(dom.find("tr", "group")) == summary["anomaly_groups"]
    assert len(dom.find("circle", "anomaly")) == summary["anomalies"]
    assert (
        sum(int(attrs["data-anomalies"]) for attrs, _ in dom.find("svg", "timeline")) == summary["anomalies"]
    )
    marked = [text for _, text in dom.find("mark")]
    worst_words = {w["text"] for g in summary["groups"] for w in g["explanation"]["words"]}
    assert worst_words and worst_words <= set(marked), (worst_words, marked)
    assert all(re.search(r"\w", text) for text in marked)
    templates = {text for _, text in dom.find("code", "group-template")}
    assert templates == {g["template"] for g in summary["groups"]}
    cards = {attrs["id"]: text for attrs, text in dom.find("div", "card")}
    assert f"{summary['precision']:.3f}" in cards["card-precision"]
    assert f"{summary['recall']:.3f}" in cards["card-recall"]
    assert len(dom.find("tr", "pattern")) > 0


def test_report_shows_the_past_incidents_each_alert_carries(
    chromium: str, replayed: tuple[Path, dict], tmp_path: Path
) -> None:
    """With --alerts, Chromium shows the notifications on-call would have received, and an
    incident that recurs carries its earlier occurrence: a notification lists, as seen
    before, the incident of an earlier notification, with its time."""
    dumped = _chromium(chromium, tmp_path, "--dump-dom", replayed[0].as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _Dom()
    dom.feed(dumped.stdout)
    rows = dom.find("tr", "alert")
    earlier: set[str] = set()
    recurring = []
    for attrs, text in rows:
        past = re.findall(r"seen before: (\S+) (logstream-[0-9a-f]{32})", text)
        recurring += [(when, fingerprint) for when, fingerprint in past if fingerprint in earlier]
        earlier.add(attrs["data-fingerprint"])
    assert rows and recurring, [text for _, text in rows]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", when) for when, _ in recurring)


def test_report_screenshot(chromium: str, replayed: tuple[Path, dict], tmp_path: Path) -> None:
    """Chromium takes a screenshot of the report: a PNG of the window's size, not a blank page."""
    shot = tmp_path / "report.png"
    result = _chromium(chromium, tmp_path, f"--screenshot={shot}", replayed[0].as_uri())
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == WINDOW
    assert len(data) > 20_000  # text, charts and tables compress to far more than a blank page


def test_demo_shows_grouped_explained_anomalies_and_writes_the_report(tmp_path: Path) -> None:
    """`logstream demo` prints the anomalies grouped by template with their surprising words
    marked, and writes report.html next to its model (few steps: this tests the wiring)."""
    result = logstream("demo", "--out", tmp_path / "demo", "--max-steps", "30")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "anomalies by template" in result.stdout and "**" in result.stdout
    page = (tmp_path / "demo" / "report.html").read_text()
    assert 'id="anomalies"' in page and 'id="timeline"' in page and 'id="patterns"' in page
