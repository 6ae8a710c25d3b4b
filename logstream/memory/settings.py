"""The incident memory's settings: how long and how much it keeps, and how it ranks.

A section of its own, so that serve's settings can hold it as they hold `feedback`
(`incidents: IncidentMemorySettings`, env `LOGSTREAM_INCIDENTS__RETENTION=...`).
"""

from __future__ import annotations

from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

from logstream.alerts.config import TEMPLATE_VARIABLE, Duration, check_url

# A certificate that expires every year is the classic recurring incident: keep a year and
# a bit, so that last year's fix is there when it comes round again.
DEFAULT_RETENTION = 400 * 86400.0
# A lookup over this many takes a few milliseconds on one CPU core, even with a 512-wide
# model (docs/incident_memory.md)
DEFAULT_MAX_INCIDENTS = 20_000


class IncidentMemorySettings(BaseModel):
    """What the memory keeps (`retention`, `max_incidents`), how a lookup ranks (`k`,
    `template_weight`, `stream_bias`) and where a past incident links to (`link`); every
    field has a default and a bound."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # incidents not seen for this long are deleted (`prune`), whatever they hold
    retention: Duration = Field(default=DEFAULT_RETENTION, gt=0)
    # at most this many incidents; past it, the oldest closed ones without a resolution go
    # first, then the oldest closed ones, then the oldest open ones
    max_incidents: int = Field(default=DEFAULT_MAX_INCIDENTS, gt=0)
    # past incidents returned per lookup
    k: int = Field(default=3, gt=0, le=100)
    # similarity = template_weight x template similarity + (1 - template_weight) x embedding
    # similarity (logstream.memory.retrieval); chosen on the dev suite (docs/incident_memory.md)
    template_weight: float = Field(default=0.9, ge=0, le=1)
    # added to the similarity of a past incident seen on the same stream
    stream_bias: float = Field(default=0.0, ge=0, le=1)
    # a past incident's link in the alerts that carry it: a URL with `{{fingerprint}}`, e.g.
    # your wiki's search or "https://logstream.example/incidents/{{fingerprint}}"; None = none
    link: str | None = None

    @field_validator("link")
    @classmethod
    def _link_template(cls, value: str | None) -> str | None:
        if value is not None:
            names = set(TEMPLATE_VARIABLE.findall(value))
            if names != {"fingerprint"}:
                raise ValueError("a link needs {{fingerprint}} and no other variable")
            check_url(TEMPLATE_VARIABLE.sub("x", value))
        return value

    def url(self, fingerprint: str) -> str:
        """A past incident's link ("" without `link`)."""
        if self.link is None:
            return ""
        return TEMPLATE_VARIABLE.sub(quote(fingerprint, safe=""), self.link)
