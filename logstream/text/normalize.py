"""Variable masking: turn a raw log line into the text the model and the miner see.

Masking removes values that are unique per line (timestamps, ids, addresses)
so that the model learns the *shape* of normal lines, not their noise. Short
integers (1-3 digits: status codes, small counts) are kept on purpose: `500`
vs `200` is exactly the kind of parameter value an anomaly detector must see,
unless the text names the integer an id: `pid 812`, Spark's `(TID 479)`.
Rules run in order; each replaces its matches with a placeholder like `<IP>`.
Masking is most of a line's host time, so the patterns are written for Python's regex
scan: a leading lookahead on the first character a match can start with lets it leave
most positions after one test (the same matches), and a rule is skipped outright on a
line without a literal it needs (`_REQUIRED_LITERALS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

MAX_LINE_CHARS = 4096  # longer lines are cut (and counted by callers): one line, one budget


@dataclass(frozen=True)
class MaskRule:
    name: str
    pattern: str
    replacement: str


DEFAULT_RULES: tuple[MaskRule, ...] = (
    # before timestamps, whose `hh:mm:ss` would take a MAC address's first three bytes
    MaskRule("mac", r"(?=[0-9a-fA-F]{2}:)\b[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}\b", "<MAC>"),
    MaskRule(
        "timestamp",
        r"(?=[\dMTWFSJAOND])"  # every branch starts with one of these
        r"(?:\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
        r"|\b\d{4}-\d{2}-\d{2}-\d{2}\.\d{2}\.\d{2}(?:\.\d+)?"  # 2005-06-03-15.42.50.675872 (IBM, BGL)
        r"|\b\d{2}/\d{2}/\d{2,4}[ :]\d{2}:\d{2}:\d{2}"
        r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
        r" +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}"
        r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} \d{2}:\d{2}:\d{2}"
        r"|\b\d{8}-\d{1,2}:\d{1,2}:\d{1,2}:\d{1,3}\b"  # 20171223-22:15:29:606 (HealthApp)
        r"|\b\d{2}:\d{2}:\d{2}(?:[.,:]\d+)?)",
        "<TS>",
    ),
    MaskRule("date", r"\b\d{4}[.-]\d{2}[.-]\d{2}\b", "<DATE>"),
    # the host field of syslog (after its timestamp) and of HPC logs (after their date):
    # `Nov 9 12:01:01 dn228/dn228 crond` -> `<TS> <HOST> crond`; host names are unique per
    # line in a cluster and would dominate the surprisal. Never a level (`<TS> INFO ...`).
    MaskRule(
        "syslog_host",
        r"(?:(?<=<TS> )|(?<=<DATE> ))(?!(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|SEVERE|"
        r"CRITICAL|CRIT|FATAL|PANIC|EMERG|ALERT)\b)\w[\w.@-]*(?:/[\w.@-]+)?(?= )",
        "<HOST>",
    ),
    # a hardware location code, which names one node of thousands (BlueGene/L's
    # `R02-M1-N0-C:J12-U11`, rack-midplane-card:jack-unit): a letter and digits, then short
    # upper-case segments after dashes
    MaskRule(
        "location",
        r"(?=[A-Z]\d)\b[A-Z]\d{1,3}(?:-[A-Z][A-Z0-9]{0,2})+(?::[A-Z]\d{1,3}(?:-[A-Z][A-Z0-9]{0,2})*)?\b",
        "<HOST>",
    ),
    MaskRule(
        "uuid",
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
        "<UUID>",
    ),
    MaskRule("block_id", r"\bblk_-?\d+", "<BLK>"),
    MaskRule("request_id", r"\breq-<UUID>|\breq-[0-9a-zA-Z-]{8,}", "<REQ>"),
    # host names before IPs: `62.99.164.82.sh.interxion.inode.at`, `dsl-059.touchtelindia.net`
    # (a dotted name ending in a generic top-level domain, or 3+ labels ending in a country
    # code; Java packages start with one instead, and `app.py` has too few labels)
    MaskRule(
        "hostname",
        r"\b(?:(?:[\w-]+\.)+(?:com|net|org|edu|gov|mil|info|biz)|(?:[\w-]+\.){2,}[a-z]{2})\b(?![.\w-])",
        "<HOST>",
    ),
    MaskRule("ipv4", r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b", "<IP>"),
    # random identifiers: 10+ letters and digits, both present (`jA9J1Wd7019391`, a queue id)
    MaskRule("identifier", r"\b(?=[A-Za-z0-9]{10})(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z0-9]{10,}\b", "<ID>"),
    MaskRule("hex", r"\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b", "<HEX>"),
    MaskRule("path", r"(?=/)(?<![\w<])(?:/[\w.\-]+){2,}/?", "<PATH>"),
    # a process, thread or task id named as such, whatever its length (`pid 812`, `pid=812`,
    # Spark's `Got assigned task 479` and `(TID 479)`): kept as a short integer, a baseline
    # of 4-digit ids made every 3-digit one a word never seen (docs/quality.md)
    MaskRule("named_id", r"(?:(?<=\b(?:TID|tid|PID|pid)[ =])|(?<=\btask ))\d+(?![\w.])", "<NUM>"),
    # a long integer alone, or after a name and a dot (a pid or a core file: `core.2275`,
    # `QQ.10018`); never inside a dotted number (`2.6.5`, `10.0.0.1`)
    MaskRule(
        "number",
        r"(?=[-\d])(?:(?<![\w.])-?\d+\.\d+(?![\w.])|(?:(?<![\w.])|(?<=[A-Za-z]\.))\d{4,}(?![\w.]))",
        "<NUM>",
    ),
)

# Literals without which a default rule cannot match (it needs one of them): `mask` skips the
# rule's regex scan on a line that has none. Looked up by the default pattern, so a rule
# whose pattern a user edited (or a model saved with older patterns) always runs.
_REQUIRED_LITERALS = {
    "mac": (":",),
    "timestamp": (":", "."),
    "date": (".", "-"),
    "syslog_host": ("<TS> ", "<DATE> "),
    "uuid": ("-",),
    "block_id": ("blk_",),
    "request_id": ("req-",),
    "hostname": (".",),
    "ipv4": (".",),
    "location": ("-",),
    "path": ("/",),
    "named_id": ("TID", "tid", "PID", "pid", "task "),
}
_PREFILTERS = {rule.pattern: _REQUIRED_LITERALS.get(rule.name, ()) for rule in DEFAULT_RULES}


# A rule ready to run: its regex, its replacement, and the literals one of which a line must
# hold for it to match (empty: no such knowledge, always run it).
CompiledRule = tuple[re.Pattern[str], str, tuple[str, ...]]


def compile_rules(rules: Iterable[MaskRule]) -> tuple[CompiledRule, ...]:
    """The rules as `Normalizer.mask` and `explain.mask_with_map` run them."""
    return tuple((re.compile(r.pattern), r.replacement, _PREFILTERS.get(r.pattern, ())) for r in rules)


def clean_line(line: str) -> str:
    """A raw line as the rules read it: without its line break, cut to MAX_LINE_CHARS, one line."""
    return line.rstrip("\r\n")[:MAX_LINE_CHARS].replace("\n", " ")


LEVELS = {
    "TRACE": "debug", "DEBUG": "debug", "INFO": "info", "NOTICE": "info",
    "WARN": "warning", "WARNING": "warning", "ERROR": "error", "ERR": "error",
    "SEVERE": "error", "CRITICAL": "critical", "CRIT": "critical", "FATAL": "critical",
    "PANIC": "critical", "EMERG": "critical", "ALERT": "critical",
}  # fmt: skip
LEVEL_RE = re.compile(r"\b(" + "|".join(LEVELS) + r")\b|\[(" + "|".join(LEVELS).lower() + r")\]")


class Normalizer:
    """Applies mask rules in order. Build once; `mask` is on the hot path."""

    def __init__(self, rules: tuple[MaskRule, ...] | list[MaskRule] = DEFAULT_RULES) -> None:
        self.rules = tuple(rules)
        self._compiled = compile_rules(self.rules)

    def mask(self, line: str) -> str:
        line = clean_line(line)
        for regex, replacement, literals in self._compiled:
            if literals and not any(literal in line for literal in literals):
                continue  # the rule cannot match here
            line = regex.sub(replacement, line)
        return line

    def to_json(self) -> list[dict[str, str]]:
        return [asdict(r) for r in self.rules]

    @classmethod
    def from_json(cls, rules: list[dict[str, str]]) -> Normalizer:
        return cls([MaskRule(**r) for r in rules])


def parse_level(line: str) -> str | None:
    """The line's log level as debug|info|warning|error|critical, if it states one."""
    match = LEVEL_RE.search(line[:MAX_LINE_CHARS])
    if match is None:
        return None
    return LEVELS[(match.group(1) or match.group(2)).upper()]
