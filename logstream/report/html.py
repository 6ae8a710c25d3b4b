"""`logstream replay --report FILE`: one self-contained HTML page of a backtest.

No external URL, font, script or stylesheet: the page opens from a ticket, a mail or an
air-gapped laptop. Charts are inline SVG drawn here. Sections:

- summary (and precision/recall/F1 when labels were given);
- score timeline per stream: score by line number, the threshold, anomaly markers;
- anomalies grouped by template, the surprising words highlighted in each example;
- patterns: every template with its count, first-seen line and time, and a new flag;
- sources that stopped logging (`logstream.scoring.quiet`), when any did;
- with `--alerts`, the notifications on-call would have received, each firing one with the
  past incidents of the replay most like it (their time, verdicts and resolution).

Large replays stay readable: the timelines show the streams with the worst scores
(`MAX_TIMELINES`), each drawn as the maximum score per pixel column, and the tables are capped.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logstream.alerts import past
from logstream.alerts.alert import Alert, rfc3339
from logstream.replay import ReplayReport, Unit
from logstream.report.groups import TemplateGroup, anomaly_groups, why

MAX_TIMELINES = 12  # streams drawn (the worst first)
MAX_MARKERS = 400  # anomaly markers per stream
MAX_GROUPS = 200
MAX_PATTERNS = 500
WIDTH, HEIGHT, PAD = 900, 120, 28  # one timeline, px

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#1d2430}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde5}
.muted{color:#5b6575} table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{border-bottom:1px solid #e6e9ef;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f6f9;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.line{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;word-break:break-all}
mark{background:#ffd6d6;color:#8a0000;font-weight:700;padding:0 1px;border-radius:2px}
.reason{color:#5b6575;font-size:12.5px} .new{background:#fff1c2;border-radius:3px;padding:0 4px;font-size:12px}
.cards{display:flex;gap:10px;flex-wrap:wrap} .card{border:1px solid #e0e4ea;border-radius:6px;padding:6px 12px}
.card b{display:block;font-size:18px} svg.timeline{display:block;margin:2px 0 10px}
svg .score{fill:none;stroke:#3b6fb6;stroke-width:1} svg .threshold{stroke:#d33;stroke-dasharray:4 3}
svg .anomaly{fill:#d33} svg text{font:11px system-ui,sans-serif;fill:#5b6575}
code.group-template{display:block;max-height:4.4em;overflow:hidden} summary{cursor:pointer;font-size:12px}
.past-incident{margin:2px 0;font-size:12.5px} .past-incident b{font-weight:600}
"""


def write_report(
    report: ReplayReport,
    summary: dict[str, Any],
    texts: Iterable[tuple[int, str, str]],
    path: Path,
    title: str,
    alerts: Sequence[Alert] | None = None,
) -> None:
    """Write the HTML report of a replay. texts: (line, stream, text) of every scored unit in
    order (`replay.unit_texts`: read again, only the anomalies drawn are kept); `alerts`: the
    notifications of `replay --alerts`, in order (None: no section)."""
    groups = anomaly_groups(report.patterns)
    body = "\n".join(
        (
            f"<h1>{_e(title)}</h1>",
            _summary(report, summary, groups),
            _timelines(report, texts),
            _groups(groups, report.unit),
            _patterns(report.patterns),
            _quiet(report),
            _alerts(alerts) if alerts is not None else "",
        )
    )
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
        f'<script type="application/json" id="summary">{_json_in_html(summary)}</script>\n</body></html>\n'
    )
    path.write_text(page, encoding="utf-8")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _json_in_html(data: dict[str, Any]) -> str:
    """JSON that cannot close its <script> element."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _summary(report: ReplayReport, summary: dict[str, Any], groups: list[TemplateGroup]) -> str:
    cards = [
        (f"{report.unit}s scored", f"{len(report.columns):,}"),
        ("streams", f"{report.streams:,}"),
        ("anomalies", f"{summary['anomalies']:,}"),
        ("groups", f"{len(groups):,}"),
        ("threshold (-log10 p)", f"{report.threshold:.2f}"),
    ]
    if report.quiet:
        cards.append(("sources that stopped logging", f"{len(report.quiet):,}"))
    if "precision" in summary:
        cards += [
            ("precision", f"{summary['precision']:.3f}"),
            ("recall", f"{summary['recall']:.3f}"),
            ("F1", f"{summary['f1']:.3f}"),
            ("AUC-PR", f"{summary['auc_pr']:.3f}"),
            ("false alarms / 1,000", f"{summary['false_alarms_per_1000']}"),
        ]
    html_cards = "".join(
        f'<div class="card" id="card-{_slug(k)}">{_e(k)}<b>{_e(v)}</b></div>' for k, v in cards
    )
    labels = (
        f"Evaluated against {summary['positives']:,} labelled anomalous {report.unit}s."
        if "precision" in summary
        else "No labels were given: precision and recall need --labels."
    )
    return (
        f'<section id="summary-cards"><div class="cards">{html_cards}</div>'
        f'<p class="muted">A score is -log10 p: the chance that a normal {report.unit} scores this high '
        f"(3 = one in 1,000). {labels}</p></section>"
    )


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _timelines(report: ReplayReport, texts: Iterable[tuple[int, str, str]]) -> str:
    columns = report.columns
    scores, lines, flagged = columns.scores(), columns.numpy("line"), columns.flagged() > 0
    stream_of = columns.numpy("stream")  # stream numbers 0.., in `columns.streams` order
    # each stream's positions in one sort, not one pass over all items per stream (sessions:
    # as many streams as items)
    order = np.argsort(stream_of, kind="stable")
    ends = np.cumsum(np.bincount(stream_of, minlength=len(columns.streams)))[:-1]
    by_stream = dict(zip(columns.streams, np.split(order, ends), strict=False))
    ranked = sorted(by_stream, key=lambda s: -scores[by_stream[s]].max())[:MAX_TIMELINES]
    first = int(lines.min()) if len(lines) else 1
    last = int(lines.max()) if len(lines) else 1
    finite = [v for v in (report.threshold * 2, *scores.tolist()) if math.isfinite(v)]
    top = max(finite, default=10.0) * 1.05 or 1.0  # the y axis; an infinite score is drawn at the top
    markers = {  # stream -> its most anomalous items (positions in `columns`), the worst first
        s: sorted((int(i) for i in by_stream[s] if flagged[i]), key=lambda i: -scores[i])[:MAX_MARKERS]
        for s in ranked
    }
    wanted = {int(lines[i]) for m in markers.values() for i in m}
    text_of = {line: text for line, _, text in texts if line in wanted}
    svgs = []
    for s in ranked:
        points = [(int(lines[i]), float(scores[i]), bool(flagged[i])) for i in by_stream[s]]
        drawn = [(int(lines[i]), float(scores[i]), text_of[int(lines[i])]) for i in markers[s]]
        svgs.append(_timeline(s, points, drawn, first, last, top, report.threshold))
    more = len(by_stream) - MAX_TIMELINES
    note = (
        f'<p class="muted">{more:,} more streams not drawn (fewer or lower scores).</p>' if more > 0 else ""
    )
    return (
        '<section id="timeline"><h2>Score timeline per stream</h2>'
        f'<p class="muted">Score by line number of the file; dashed: the threshold ({report.threshold:.2f}); '
        "red dots: anomalies (hover for the line).</p>" + "".join(svgs) + note + "</section>"
    )


def _timeline(
    stream: str,
    points: list[tuple[int, float, bool]],
    markers: list[tuple[int, float, str]],
    first: int,
    last: int,
    top: float,
    threshold: float,
) -> str:
    """points: (line, score, anomaly) of the stream's items; markers: (line, score, text) to draw."""
    span = max(last - first, 1)
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD + 10

    def x(line: int) -> float:
        return PAD + inner_w * (line - first) / span

    def y(score: float) -> float:
        return PAD - 10 + inner_h * (1 - min(score, top) / top)

    columns: dict[int, float] = {}  # pixel column -> worst score there
    for line, score, _ in points:
        col = int(x(line))
        columns[col] = max(columns.get(col, 0.0), score)
    polyline = " ".join(f"{col},{y(score):.1f}" for col, score in sorted(columns.items()))
    circles = "".join(
        f'<circle class="anomaly" data-line="{line}" cx="{x(line):.1f}" cy="{y(score):.1f}" r="3">'
        f"<title>line {line}, score {score:.2f}: {_e(text[:300])}</title></circle>"
        for line, score, text in sorted(markers)
    )
    flagged = sum(anomaly for _, _, anomaly in points)
    return (
        f'<svg class="timeline" data-stream="{_e(stream)}" data-anomalies="{flagged}" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="scores of stream {_e(stream)}">'
        f'<text x="{PAD}" y="12">{_e(stream)}: {len(points):,} lines, {flagged:,} anomalies</text>'
        f'<text x="{WIDTH - PAD}" y="12" text-anchor="end">lines {first:,}-{first + span:,}</text>'
        f'<line class="threshold" x1="{PAD}" x2="{WIDTH - PAD}" y1="{y(threshold):.1f}" y2="{y(threshold):.1f}"/>'
        f'<polyline class="score" points="{polyline}"/>{circles}</svg>'
    )


def _highlighted(u: Unit) -> str:
    """The line's template with the surprising words marked, and why; the line itself folded."""
    if u.explanation is None:
        return f'<div class="line">{_e(u.text)}</div>'
    template = "".join(f"<mark>{_e(t)}</mark>" if hit else _e(t) for t, hit in u.explanation.compact(400))
    return (
        f'<div class="line template">{template}</div><div class="reason">{_e(why(u))}</div>'
        f'<details><summary class="muted">the line</summary><div class="line">{_e(u.text)}</div></details>'
    )


def _groups(groups: list[TemplateGroup], unit: str) -> str:
    rows = []
    for g in groups[:MAX_GROUPS]:
        examples = sorted({id(u): u for u in (g.worst, *g.examples)}.values(), key=lambda u: u.line)
        shown = "".join(
            f'<div class="example" data-line="{u.line}"><span class="muted">line {u.line} · {_e(u.stream)} · '
            f"score {u.score:.2f}</span>{_highlighted(u)}</div>"
            for u in examples
        )
        streams = g.streams
        rows.append(
            f'<tr class="group"><td class="num">{g.worst.score:.2f}</td><td class="num">{g.count:,}</td>'
            f'<td class="num">{g.first:,}{"" if g.count == 1 else f"-{g.last:,}"}</td>'
            f"<td>{_e(', '.join(streams[:5]))}{'' if len(streams) <= 5 else f' +{len(streams) - 5}'}</td>"
            f'<td><code class="group-template">{_e(g.template)}</code>'
            f"{' <span class=new>new template</span>' if g.novel else ''}{shown}</td></tr>"
        )
    more = len(groups) - MAX_GROUPS
    note = f'<p class="muted">{more:,} more groups in the JSON summary (--json).</p>' if more > 0 else ""
    empty = f"<p>No {unit} crossed the threshold.</p>" if not groups else ""
    return (
        f'<section id="anomalies"><h2>Anomalies by template ({len(groups):,} groups)</h2>{empty}'
        "<table><thead><tr><th>worst</th><th>count</th><th>lines</th><th>streams</th>"
        f"<th>template, and examples with the surprising words marked</th></tr></thead><tbody>{''.join(rows)}"
        f"</tbody></table>{note}</section>"
    )


def _table(
    section: str,
    title: str,
    intro: str,
    headers: Sequence[str],
    rows: Sequence[str],
    total: int,
    left_out: str,
) -> str:
    """A section of one table: its heading, a line saying what it shows, the rows shown, and
    how many of `total` were left out (`left_out` says where they are)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    more = total - len(rows)
    note = f'<p class="muted">{more:,} {left_out}</p>' if more > 0 else ""
    return (
        f'<section id="{section}"><h2>{title}</h2><p class="muted">{intro}</p>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}</section>"
    )


def _patterns(patterns: list[TemplateGroup]) -> str:
    ranked = sorted(patterns, key=lambda g: (-g.count, g.first))
    rows = [
        f'<tr class="pattern"><td><code>{_e(g.template)}</code></td><td class="num">{g.count:,}</td>'
        f'<td class="num">{g.first:,}</td><td>{_e(g.first_time or "")}</td>'
        f'<td class="num">{g.anomalies.count if g.anomalies else 0:,}</td>'
        f"<td>{'<span class=new>new</span>' if g.novel else ''}</td></tr>"
        for g in ranked[:MAX_PATTERNS]
    ]
    return _table(
        "patterns", f"Patterns ({len(patterns):,} templates)",
        'Every template of the replay: "new" means the model had never seen it.',
        ("template", "count", "first line", "first seen", "anomalies", "new"), rows, len(ranked),
        "rarer patterns not listed.",
    )  # fmt: skip


def _quiet(report: ReplayReport) -> str:
    if not report.quiet:
        return ""
    rows = [
        f'<tr class="quiet"><td class="num">{q.score:.2f}</td>'
        f'<td class="num">{q.record.offset + 1 if q.record.offset is not None else ""}</td>'
        f'<td>{_e(q.record.stream)}</td><td class="line">{_e(q.record.line)}</td></tr>'
        for q in report.quiet[:MAX_GROUPS]
    ]
    return _table(
        "quiet-sources", f"Sources that stopped logging ({len(report.quiet):,})",
        "A source (a syslog host and program, or a logger) silent for longer than its own rhythm allows, "
        "noticed at a later line of its stream; the score is -log10 p of a normal gap this long.",
        ("score", "noticed at line", "stream", "source"), rows, len(report.quiet),
        "more in the JSON summary (--json).",
    )  # fmt: skip


def _alerts(alerts: Sequence[Alert]) -> str:
    rows = [
        f'<tr class="alert" data-fingerprint="{_e(a.dedup_key)}"><td>{_e(rfc3339(a.notified_at))}</td>'
        f"<td>{_e(a.status)}</td><td>{_e(a.severity)}</td><td>{_e(a.stream)}</td>"
        f'<td><div class="line">{_e(a.summary)}</div>{"".join(map(_past_incident, a.past_incidents))}</td></tr>'
        for a in alerts[:MAX_GROUPS]
    ]
    return _table(
        "alerts", f"Alerts on-call would have received ({len(alerts):,})",
        "Each notification as the routes file groups and times it on the log's own time; a firing one "
        "with the incidents earlier in this replay most like it, what was said about them (verdicts "
        "from --feedback) and their resolution.",
        ("notified", "status", "severity", "stream", "summary, and the incidents seen before"), rows,
        len(alerts), "more notifications not listed.",
    )  # fmt: skip


def _past_incident(found: dict[str, Any]) -> str:
    """One past incident an alert carries: when and which, what was said, what was done."""
    said, done = past.verdicts(found), past.resolution(found)
    return (
        f'<div class="past-incident" data-fingerprint="{_e(found.get("fingerprint", ""))}">'
        f'seen before: <span class="past-headline">{_e(past.headline(found))}</span>'
        + (f'; <b>verdict</b> <span class="past-verdict">{_e(said)}</span>' if said else "")
        + (f'; <b>resolution</b> <span class="past-resolution">{_e(done)}</span>' if done else "")
        + "</div>"
    )
