"""Links an alert carries: URL templates from the routes file, filled per alert.

    links:
      - name: Logs (Grafana Explore)
        url: "https://grafana.example/explore?left=...{{stream}}...&from={{from_ms}}&to={{to_ms}}"
    route:
      runbook_url: "https://runbooks.example/logstream/{{labels.team}}"

`{{variable}}` takes one of config.LINK_VARIABLES or `labels.NAME`; values are
URL-encoded (`quote(value, safe="")`), so a stream name or log text can never
break out of its query parameter. The time range (`from`/`to`, `from_ms`/`to_ms`)
is the incident's log time (first to last anomaly), widened by LINK_MARGIN on
each side so the lines around it show. Channels use the links: PagerDuty
`links`, Slack buttons, Alertmanager `generatorURL` (the first link) and a
`runbook_url` annotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

from logstream.alerts.config import TEMPLATE_VARIABLE, Link, rfc3339

LINK_MARGIN = 300.0  # seconds shown before the first and after the last anomaly
RUNBOOK = "Runbook"


def link_variables(
    values: Mapping[str, str], labels: Mapping[str, str], starts: float, ends: float
) -> dict[str, str]:
    """Every variable a template may use, as text (before URL-encoding)."""
    start, end = starts - LINK_MARGIN, ends + LINK_MARGIN
    out = {
        **values,
        "starts_at": rfc3339(starts),
        "ends_at": rfc3339(ends),
        "from": rfc3339(start),
        "to": rfc3339(end),
        "from_ms": str(int(start * 1000)),
        "to_ms": str(int(end * 1000)),
    }
    out.update({f"labels.{name}": value for name, value in labels.items()})
    return out


def render(template: str, variables: Mapping[str, str]) -> str:
    """Fill `{{name}}`s, URL-encoded; a label the alert lacks renders empty."""
    return TEMPLATE_VARIABLE.sub(lambda m: quote(variables.get(m.group(1), ""), safe=""), template)


def render_links(
    links: Sequence[Link], runbook_url: str | None, variables: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(name, url) of each configured link, then the route's runbook."""
    out = [(link.name, render(link.url, variables)) for link in links]
    if runbook_url:
        out.append((RUNBOOK, render(runbook_url, variables)))
    return out
