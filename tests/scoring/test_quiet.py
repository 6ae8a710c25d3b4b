"""Sources that stop logging (logstream/scoring/quiet.py): the watch, and replay and tail through it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from quiet_support import START, THRESHOLD, after_restart, baseline_lines, line, rhythm, stopped_job

from logstream.cli import train_summary
from logstream.detector import Detector
from logstream.engine.model import META_FILE
from logstream.lifecycle.retrain import refresh_prompt
from logstream.lifecycle.train import TrainConfig, save, train
from logstream.records import Stream
from logstream.replay import ReplayOptions, ReplayReport, load_replay_input, run_replay, unit_texts
from logstream.report.html import write_report
from logstream.scoring.gpd import MIN_SAMPLES
from logstream.scoring.quiet import MIN_QUIET_SECONDS, Baseline, QuietWatch, learn_baseline, source_of
from logstream.tail import TailOptions, run_tail


def watch_all(
    events: list[tuple[float, str]], watch: QuietWatch | None = None, baseline: Baseline | None = None
) -> list:
    watch = watch or QuietWatch()
    return [q for t, source in events for q in watch.observe("web-1", line(t, source), THRESHOLD, baseline)]


def test_source_of_reads_syslog_iso_and_prefixed_headers() -> None:
    """The source is the header's host and program, whatever comes before the header."""
    assert source_of("Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure")[0] == (
        "combo sshd(pam_unix)"
    )
    assert source_of("2026-11-02T08:00:03.119Z web-1 cron[7]: done") == ("web-1 cron", 1_793_606_403.119)
    thunderbird = (
        "1131566461 2005.11.09 dn228 Nov 9 12:01:01 dn228/dn228 crond(pam_unix)[2915]: session closed"
    )
    assert source_of(thunderbird)[0] == "dn228/dn228 crond(pam_unix)"
    assert source_of("no header at all") is None


def test_source_of_reads_the_logger_of_log4j_and_python_logging_lines() -> None:
    """Without a syslog header, the logger after the time, pid, level and [thread] is the source."""
    hadoop = "2015-10-18 18:01:47,978 INFO [main] org.apache.hadoop.mapreduce.v2.app.MRAppMaster: Created"
    assert source_of(hadoop) == ("org.apache.hadoop.mapreduce.v2.app.MRAppMaster", 1_445_191_307.978)
    openstack = "nova-api.log.1 2017-05-16 00:00:00.008 25746 INFO nova.osapi_compute.wsgi.server [req-3] GET"
    assert source_of(openstack)[0] == "nova.osapi_compute.wsgi.server"
    assert source_of("2016-09-28 04:30:30, Info                  CBS    Loaded Servicing Stack")[0] == "CBS"
    # a level with a host before it is no logger line (logstream's synthetic format), nor a "-"
    assert source_of("2026-11-02T08:00:00.116Z web-2 INFO http: POST /api/carts status=200") is None
    assert source_of("2015-07-29 19:04:12,394 - INFO  [/10.10.34.11:3888:Listener@493] - Received") is None


def test_regular_sources_stay_quiet_for_days() -> None:
    """Two regular sources over two days: no source is ever called quiet."""
    assert watch_all(rhythm(0, START, START + 2 * 86_400)) == []


def test_a_job_that_stops_is_noticed_once_within_its_rhythm() -> None:
    """The cron job stops after 2.5 h while the app goes on: one quiet source, the cron job,
    noticed within three of its periods, and only once however long the silence."""
    quiet = watch_all(stopped_job())
    assert [q.source for q in quiet] == ["web-1 cron"]
    q = quiet[0]
    assert q.score > q.threshold == THRESHOLD
    assert 330 < q.noticed_at - q.last_seen < 900
    assert "web-1 cron has not logged for" in q.describe()


def test_one_line_from_a_wrong_clock_does_not_stop_the_watch() -> None:
    """A line a year ahead, from another program, in the middle: the job that stops later is
    still noticed, and nothing else is called quiet."""
    events = stopped_job()
    events.insert(len(events) // 3, (START + 365 * 86_400, "web-1 ntpd"))
    assert [q.source for q in watch_all(events)] == ["web-1 cron"]


def test_a_short_silence_is_never_quiet() -> None:
    """A source that logs every second is statistically quiet after a few seconds; it is named
    only past MIN_QUIET_SECONDS: a 40 s pause is not, a stop is, a minute after its last line."""
    beat = [(START + s, "web-1 agent") for s in range(1200)]
    app = [(START + s + 0.5, "web-1 app") for s in range(0, 1200, 7)]
    pause = [(t, s) for t, s in beat if not START + 300 <= t < START + 340]
    assert watch_all(sorted(pause + app)) == []
    stop = [(t, s) for t, s in beat if t < START + 300]
    (quiet,) = watch_all(sorted(stop + app))
    assert quiet.source == "web-1 agent" and MIN_QUIET_SECONDS <= quiet.noticed_at - quiet.last_seen < 90


def test_a_host_that_slept_is_not_quiet_when_it_wakes() -> None:
    """Every source stops for 10 h and comes back: the stream slept, no source went quiet."""
    before = rhythm(3, START, START + 4 * 3600)
    after = rhythm(4, START + 14 * 3600, START + 18 * 3600)
    assert watch_all(before + after) == []


def test_a_source_alerts_again_after_it_came_back() -> None:
    """A flagged silence ends when the source logs again; its long gap is not learned, so the
    next silence is noticed as soon as the first."""
    events = (
        rhythm(5, START, START + 4 * 3600)
        + rhythm(6, START + 4 * 3600, START + 6 * 3600, cron=False)
        + rhythm(7, START + 6 * 3600, START + 10 * 3600)
        + rhythm(8, START + 10 * 3600, START + 12 * 3600, cron=False)
    )
    quiet = watch_all(sorted(events))
    assert [q.source for q in quiet] == ["web-1 cron", "web-1 cron"]
    first, second = (q.noticed_at - q.last_seen for q in quiet)
    assert second < 1.5 * first


def test_the_watch_forgets_the_least_recently_heard_sources() -> None:
    """Past max_sources the oldest source is forgotten: memory is bounded by the cap."""
    watch = QuietWatch(max_sources=4)
    for i in range(10):
        watch.observe("web-1", line(START + i, f"web-1 job{i}"), THRESHOLD)
    assert len(watch) == 4


def test_a_new_watch_notices_a_stopped_job_from_its_baseline_rhythm() -> None:
    """A new watch (a restarted serve, a replay of a later log) has no gaps of its own: the
    job that runs once and stops is noticed only from the baseline's rhythms, within three of
    its periods, and said to be what the baseline saw; a regular day stays quiet."""
    baseline = learn_baseline([Stream("web-1", baseline_lines())])
    assert sorted(baseline) == ["web-1 app", "web-1 cron"]
    later = after_restart(1, START + 86_400)
    assert watch_all(later) == []
    quiet = watch_all(later, baseline=baseline)
    assert [q.source for q in quiet] == ["web-1 cron"]
    assert 330 < quiet[0].noticed_at - quiet[0].last_seen < 900
    assert quiet[0].gaps == baseline["web-1 cron"].gaps
    assert "gaps of the model's training lines" in quiet[0].describe()
    assert watch_all(rhythm(3, START + 86_400, START + 2 * 86_400), baseline=baseline) == []


def test_a_source_in_several_baseline_streams_keeps_its_busiest_rhythm() -> None:
    """`web-1 cron` in two baseline streams: the one with more gaps is kept; a source with
    fewer than MIN_SAMPLES gaps is left out."""
    long, short = rhythm(0, START, START + 3 * 3600), rhythm(1, START, START + 2 * 3600)
    streams = [
        Stream("short", [line(t, s) for t, s in short]),
        Stream("long", [line(t, s) for t, s in long]),
        Stream("once", [line(START, "web-2 cron"), line(START + 300, "web-2 cron")]),
    ]
    baseline = learn_baseline(streams)
    assert sorted(baseline) == ["web-1 app", "web-1 cron"]
    assert baseline["web-1 cron"].gaps == sum(s == "web-1 cron" for _, s in long) - 1


def test_the_baseline_rhythm_gives_way_to_the_sources_own() -> None:
    """The job ran every 5 min in the baseline and now runs every minute: once it has
    MIN_SAMPLES gaps of its own, its own rhythm judges it, and a stop is noticed within
    minutes instead of at the baseline's limit."""
    baseline = learn_baseline([Stream("web-1", baseline_lines())])
    start = START + 86_400
    minutely = [(start + 60 * i, "web-1 cron") for i in range(MIN_SAMPLES + 10)]
    app = rhythm(4, start, start + 3 * 3600, cron=False)
    quiet = watch_all(sorted(minutely + app), baseline=baseline)
    assert [q.source for q in quiet] == ["web-1 cron"]
    assert quiet[0].noticed_at - quiet[0].last_seen < 180
    assert quiet[0].gaps == MIN_SAMPLES + 9  # its own gaps, not the baseline's
    assert f"in its last {MIN_SAMPLES + 9} gaps" in quiet[0].describe()


@pytest.fixture(scope="module")
def stopped_job_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log whose cron job stops after 2.5 h while the app logs 1 h more."""
    path = tmp_path_factory.mktemp("quiet") / "stopped.log"
    path.write_text("".join(line(t, source) + "\n" for t, source in stopped_job()))
    return path


@pytest.fixture(scope="module")
def stopped_job_replay(stopped_job_log: Path, synthetic_model_dir: Path) -> ReplayReport:
    options = ReplayOptions(input=stopped_job_log, model=synthetic_model_dir, alerts=True)
    return run_replay(options, load_replay_input(options))


def test_replay_lists_the_quiet_source_and_alerts_on_it(
    stopped_job_log: Path, stopped_job_replay: ReplayReport
) -> None:
    """Replay reports the stopped job in `quiet_sources`, at the line that showed it, and with
    alerts hands serve's Anomaly (kind "quiet") to the alert routes."""
    listed = stopped_job_replay.summary()["quiet_sources"]
    assert [q["template"] for q in listed] == ["quiet source: web-1 cron"]
    shown_at = stopped_job_log.read_text().splitlines()[listed[0]["line"] - 1]
    assert "web-1 app" in shown_at
    assert listed[0]["score"] > listed[0]["threshold"]
    quiet = [a for a in stopped_job_replay.anomalies if a.kind == "quiet"]
    assert len(quiet) == 1 and quiet[0].template == "quiet source: web-1 cron"
    assert quiet[0].detected_at == quiet[0].event_time  # noticed at the log's own time


def test_the_html_report_shows_the_quiet_source(
    stopped_job_log: Path, stopped_job_replay: ReplayReport, tmp_path: Path
) -> None:
    """`replay --report` has a section for sources that stopped logging, naming the job."""
    page, data = tmp_path / "report.html", load_replay_input(ReplayOptions(input=stopped_job_log))
    texts = unit_texts(data, stopped_job_replay.columns)
    write_report(stopped_job_replay, stopped_job_replay.summary(), texts, page, title="quiet")
    text = page.read_text()
    section = text[text.index('<section id="quiet-sources">') :]
    assert section.count('<tr class="quiet">') == 1
    assert "web-1 cron has not logged for" in section


def test_replay_without_the_watch_lists_no_quiet_source(
    stopped_job_log: Path, synthetic_model_dir: Path
) -> None:
    """`logstream replay --no-quiet-sources` (as serve's `quiet_sources: false`) lists none."""
    result = subprocess.run(
        [sys.executable, "-m", "logstream.cli", "replay", str(stopped_job_log), "--model", str(synthetic_model_dir),
         "--no-quiet-sources", "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert json.loads(result.stdout.splitlines()[-1])["quiet_sources"] == []


def test_tail_prints_the_quiet_source(stopped_job_log: Path, synthetic_model_dir: Path) -> None:
    """`logstream tail` watches sources as serve does and prints the quiet one as an anomaly."""
    out = io.StringIO()
    run_tail(
        TailOptions([str(stopped_job_log)], once=True, json_output=True),
        Detector.load(synthetic_model_dir),
        out,
    )
    quiet = [a for a in map(json.loads, out.getvalue().splitlines()) if a["kind"] == "quiet"]
    assert [a["template"] for a in quiet] == ["quiet source: web-1 cron"]
    assert quiet[0]["stream"] == "default" and quiet[0]["location"].startswith(f"{stopped_job_log}:")


def test_train_keeps_the_rhythms_and_replay_starts_from_them(tmp_path: Path) -> None:
    """`train` saves each source's rhythm with the model; `replay --model` of a later log
    where the job runs once and stops names it, and without the saved rhythms it cannot. A
    version whose prompt is rebuilt from new data (`train --from M --prompt-only`) keeps the
    new data's rhythms."""
    baseline = [line(t, source) for t, source in rhythm(0, START, START + 3 * 3600)]
    trained = train(
        [Stream("web-1", baseline)], TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4)
    )
    assert trained.meta["quiet_baseline"]["web-1 cron"]["gaps"] >= MIN_SAMPLES
    assert "; rhythms of 2 sources kept" in train_summary(tmp_path / "model", trained.meta)
    log = tmp_path / "later.log"
    log.write_text("".join(line(t, source) + "\n" for t, source in after_restart(1, START + 86_400)))

    def quiet_sources(model: Path) -> list[str]:
        options = ReplayOptions(input=log, model=model)
        report = run_replay(options, load_replay_input(options))
        return [q["template"] for q in report.summary()["quiet_sources"]]

    save(trained, tmp_path / "model")
    assert quiet_sources(tmp_path / "model") == ["quiet source: web-1 cron"]
    # the job ran once in the new data: no rhythm of it there
    later = [line(t, source) for t, source in after_restart(1, START + 86_400)]
    refreshed = refresh_prompt(tmp_path / "model", [Stream("web-1", later)], TrainConfig())
    assert sorted(refreshed.meta["quiet_baseline"]) == ["web-1 app"]
    meta = json.loads((tmp_path / "model" / META_FILE).read_text())
    del meta["quiet_baseline"]
    (tmp_path / "model" / META_FILE).write_text(json.dumps(meta))
    assert quiet_sources(tmp_path / "model") == []
