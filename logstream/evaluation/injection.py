"""Seeded incidents injected into real logs, in each log's own layout, with line labels.

The dev suite of `benchmarks/quality.py`: each loghub sample is cut in two; the first half
is the baseline a user would train on, the second the log to score. Incidents go into the
second half (labelled 1), and one *recurring* kind also goes into the baseline, as 2-5% of
its lines, unlabelled: a baseline full of a recurring failure, which the model learns as
ordinary, is what real users have. Every injected line takes the header (time, host, pid
columns) of the line it follows and writes its level and source the way that log's format
does, so that only what the line says tells it apart.

Kinds, each as a system daemon (`system` style: syslog-like logs) and as an application
service (`app` style: log4j-like logs) would write it:
- java_exception: an uncaught exception with its stack trace (continuation lines unprefixed)
- connection_storm: a burst of accepted connections from many addresses (no failure word)
- disk_full: writes failing with `No space left on device`
- oom: the kernel's OOM killer, or a JVM's `OutOfMemoryError`
- auth_flood: failed logins for many users from one address
- restart_loop: a service that exits and is restarted, four times (systemd's wording)
- tls_failure: handshakes failing on an expired certificate
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = (
    "java_exception", "connection_storm", "disk_full", "oom", "auth_flood", "restart_loop", "tls_failure",
)  # fmt: skip
# the kinds a baseline can be contaminated with: failures that recur in real baselines
RECURRING_KINDS = ("java_exception", "disk_full", "oom", "auth_flood", "tls_failure")

Line = tuple[str | None, str, str]  # (level, source, message); level None: a continuation line


@dataclass(frozen=True)
class LogFormat:
    """How one log writes a line: `header` matches what an injected line copies from the line
    before it; `render(header, level, source, message, rng)` writes the rest. `levels` maps
    info/warning/error/critical to the format's own words (empty: the format has none)."""

    header: re.Pattern[str]
    render: Callable[[re.Match[str], str, str, str, random.Random], str]
    style: str  # "system" | "app"
    levels: dict[str, str] = field(default_factory=dict)


def _level(fmt: LogFormat, level: str) -> str:
    return fmt.levels.get(level, "")


def _syslog(m: re.Match[str], level: str, source: str, message: str, rng: random.Random) -> str:
    return f"{m.group('head')}{source}: {message}"


def _tagged(m: re.Match[str], level: str, source: str, message: str, rng: random.Random) -> str:
    return f"{m.group('head')}{level} {source}: {message}"


def _format(pattern: str, render: Callable, style: str, levels: dict[str, str] | None = None) -> LogFormat:
    return LogFormat(re.compile(pattern), render, style, levels or {})


LOG4J = {"info": "INFO", "warning": "WARN", "error": "ERROR", "critical": "FATAL"}
SYSLOG_HEAD = r"(?P<head>\w{3} +\d+ \d\d:\d\d:\d\d \S+ )"

# loghub's 15 samples, by file name
FORMATS: dict[str, LogFormat] = {
    "Linux": _format(SYSLOG_HEAD, _syslog, "system"),
    "Mac": _format(SYSLOG_HEAD, _syslog, "system"),
    "OpenSSH": _format(SYSLOG_HEAD, _syslog, "system"),
    "Thunderbird": _format(r"(?P<head>\d+ \d{4}\.\d\d\.\d\d \S+ \w{3} +\d+ \d\d:\d\d:\d\d \S+ )", _syslog, "system"),
    "HPC": _format(
        r"(?P<head>\d+ \S+ )\S+ \S+ (?P<epoch>\d+) \d+ ",
        lambda m, level, source, message, rng: f"{m.group('head')}{source} {m.group('epoch')} 1 {message}",
        "system",
    ),
    "Proxifier": _format(
        r"(?P<head>\[[^\]]+\] )", lambda m, level, source, message, rng: f"{m.group('head')}{source} - {message}",
        "system",
    ),
    "Android": _format(
        r"(?P<head>\d\d-\d\d \d\d:\d\d:\d\d\.\d+\s+\d+\s+\d+ )[VDIWEFA] ", _tagged, "app",
        {"info": "I", "warning": "W", "error": "E", "critical": "F"},
    ),
    "Apache": _format(
        r"(?P<head>\[[^\]]+\] )\[\w+\] ",
        lambda m, level, source, message, rng: f"{m.group('head')}[{level}] {source}: {message}",
        "app", {"info": "notice", "warning": "warn", "error": "error", "critical": "crit"},
    ),
    "HDFS": _format(r"(?P<head>\d{6} \d{6} \d+ )[A-Z]+ ", _tagged, "app", LOG4J),
    "Hadoop": _format(
        r"(?P<head>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ )[A-Z]+ (?P<thread>\[[^\]]*\] )",
        lambda m, level, source, message, rng: f"{m.group('head')}{level} {m.group('thread')}{source}: {message}",
        "app", LOG4J,
    ),
    "HealthApp": _format(
        r"(?P<head>\d{8}-\d+:\d+:\d+:\d+\|)",
        lambda m, level, source, message, rng: f"{m.group('head')}{source}|{rng.randrange(10**7, 10**8)}|{message}",
        "app",
    ),
    "OpenStack": _format(
        r"(?P<head>\S+ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \d+ )[A-Z]+ ",
        lambda m, level, source, message, rng: f"{m.group('head')}{level} {source} [-] {message}",
        "app", {"info": "INFO", "warning": "WARNING", "error": "ERROR", "critical": "CRITICAL"},
    ),
    "Spark": _format(r"(?P<head>\d\d/\d\d/\d\d \d\d:\d\d:\d\d )[A-Z]+ ", _tagged, "app", LOG4J),
    "Windows": _format(
        r"(?P<head>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d, )\w+\s+",
        lambda m, level, source, message, rng: f"{m.group('head')}{level:<22}{source:<6} {message}",
        "app", {"info": "Info", "warning": "Warning", "error": "Error", "critical": "Error"},
    ),
    "Zookeeper": _format(
        r"(?P<head>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - )[A-Z]+\s+",
        lambda m, level, source, message, rng: f"{m.group('head')}{level:<5} [main:{source}@{rng.randrange(50, 900)}] - {message}",
        "app", LOG4J,
    ),
}  # fmt: skip

_SERVICES = ("billing", "ingest", "gateway", "scheduler", "indexer", "mailer")
_USERS = ("root", "admin", "oracle", "test", "guest", "postgres", "ubuntu", "git", "deploy", "support")
_CLASSES = ("OrderService", "BlockReceiver", "SessionManager", "RequestHandler", "CacheLoader", "JobRunner")


def _ip(rng: random.Random) -> str:
    return ".".join(str(rng.randrange(1, 255)) for _ in range(4))


def incident(kind: str, style: str, rng: random.Random) -> list[Line]:
    """The lines of one incident of `kind`, as a `style` ("system" or "app") log writes them."""
    pid, service = rng.randrange(1000, 32000), rng.choice(_SERVICES)
    system = style == "system"
    if kind == "java_exception":
        cls = rng.choice(_CLASSES)
        pkg = f"com.example.{service}"
        frames = [
            f"\tat {pkg}.{rng.choice(_CLASSES)}.{m}({rng.choice(_CLASSES)}.java:{rng.randrange(40, 900)})"
            for m in rng.sample(("handle", "process", "run", "apply", "call", "dispatch"), 4)
        ]
        head = f"{'java[' + str(pid) + ']' if system else pkg + '.' + cls}"
        return [
            ("error", head, f'Exception in thread "worker-{rng.randrange(1, 64)}" java.lang.IllegalStateException: '
             f"{rng.choice(('queue is closed', 'session expired', 'no leader'))}"),
            *((None, "", frame) for frame in frames),
            (None, "", "Caused by: java.io.IOException: Broken pipe"),
            (None, "", f"\t... {rng.randrange(5, 40)} more"),
        ]  # fmt: skip
    if kind == "connection_storm":
        source = f"{service}[{pid}]" if system else f"{service}.net.Acceptor"
        return [
            ("info", source, f"Accepted connection from {_ip(rng)}:{rng.randrange(1024, 65535)}")
            for _ in range(rng.randrange(12, 21))
        ]
    if kind == "disk_full":
        source = f"{service}[{pid}]" if system else f"{service}.storage.SegmentWriter"
        return [
            ("error", source, f"Failed to write /var/lib/{service}/segment-{rng.randrange(10**5):05d}.log: "
             "No space left on device")
            for _ in range(rng.randrange(3, 6))
        ]  # fmt: skip
    if kind == "oom":
        proc = rng.choice(("java", "python", "mysqld", "postgres", "node"))
        if system:
            return [
                ("critical", "kernel", f"Out of memory: Kill process {pid} ({proc}) score {rng.randrange(300, 999)} "
                 "or sacrifice child"),
                ("critical", "kernel", f"Killed process {pid} ({proc}) total-vm:{rng.randrange(10**6, 9 * 10**6)}kB, "
                 f"anon-rss:{rng.randrange(10**5, 9 * 10**5)}kB, file-rss:0kB"),
            ]  # fmt: skip
        return [
            ("critical", f"{service}.worker.Executor", "java.lang.OutOfMemoryError: Java heap space"),
            ("error", f"{service}.worker.Executor", f"Task {rng.randrange(10**4)} aborted: executor lost"),
        ]
    if kind == "auth_flood":
        ip = _ip(rng)
        if system:
            return [
                ("warning", f"sshd[{pid + i}]", f"Failed password for invalid user {user} from {ip} port "
                 f"{rng.randrange(1024, 65535)} ssh2")
                for i, user in enumerate(rng.choices(_USERS, k=rng.randrange(10, 21)))
            ]  # fmt: skip
        return [
            ("warning", f"{service}.auth.LoginFilter", f"Authentication failed for user '{user}' from {ip}: "
             "invalid credentials")
            for user in rng.choices(_USERS, k=rng.randrange(10, 21))
        ]  # fmt: skip
    if kind == "restart_loop":
        out: list[Line] = []
        for attempt in range(1, 5):
            if system:
                unit = f"{service}.service"
                out += [
                    ("info", "systemd[1]", f"{unit}: Main process exited, code=exited, status=1/FAILURE"),
                    (
                        "info",
                        "systemd[1]",
                        f"{unit}: Scheduled restart job, restart counter is at {attempt}.",
                    ),
                    ("info", "systemd[1]", f"Started {service.capitalize()} daemon."),
                ]
            else:
                out += [
                    (
                        "info",
                        f"{service}.Main",
                        f"Starting {service} 2.{rng.randrange(10)}.{rng.randrange(10)}",
                    ),
                    (
                        "info",
                        f"{service}.Main",
                        f"Shutdown hook invoked, exit code {rng.choice((1, 137, 143))}",
                    ),
                ]
        return out
    if kind == "tls_failure":
        host = f"{rng.choice(('api', 'db', 'auth', 'cache'))}-{rng.randrange(1, 9)}.internal"
        source = f"{service}[{pid}]" if system else f"{service}.tls.Handshaker"
        return [
            ("error", source, f"TLS handshake with {host}:{rng.choice((443, 8443, 5432))} failed: "
             "x509: certificate has expired or is not yet valid")
            for _ in range(rng.randrange(3, 7))
        ]  # fmt: skip
    raise ValueError(f"kind: unknown {kind!r}; expected one of {KINDS}")


def render(fmt: LogFormat, after: str, lines: list[Line], rng: random.Random) -> list[str]:
    """`lines` written in `fmt`, each with the header of the line `after` (which they follow);
    continuation lines as they are. A line whose header `fmt` cannot read lends none: the
    incident's lines then start with their source."""
    found = fmt.header.match(after)
    out = []
    for level, source, message in lines:
        if level is None:
            out.append(message)
        elif found is None:
            out.append(f"{source}: {message}")
        else:
            out.append(fmt.render(found, _level(fmt, level), source, message, rng))
    return out


@dataclass
class InjectedLog:
    lines: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    kinds: list[str | None] = field(default_factory=list)

    def add(self, lines: list[str], label: int, kind: str | None) -> None:
        self.lines += lines
        self.labels += [label] * len(lines)
        self.kinds += [kind] * len(lines)


def inject(
    lines: list[str],
    fmt: LogFormat,
    plan: list[str],
    rng: random.Random,
    label: int = 1,
) -> InjectedLog:
    """`lines` with one incident per entry of `plan` (a kind), each after a seeded random line."""
    places = sorted(rng.sample(range(len(lines)), len(plan)))
    at: dict[int, list[str]] = {}
    for place, kind in zip(places, plan, strict=True):
        at.setdefault(place, []).append(kind)
    out = InjectedLog()
    for i, line in enumerate(lines):
        out.add([line], 0, None)
        for kind in at.get(i, ()):
            out.add(render(fmt, line, incident(kind, fmt.style, rng), rng), label, kind)
    return out


@dataclass(frozen=True)
class DevLog:
    """One log of the dev suite: train on `baseline`, score `scored` against `labels`."""

    name: str
    baseline: list[str]
    scored: list[str]
    labels: list[int]
    kinds: list[str | None]
    recurring: str | None  # the kind that also contaminates the baseline


def dev_log(
    name: str,
    lines: list[str],
    seed: int,
    per_kind: int = 2,
    contamination: float = 0.03,
    clean: bool = False,
    recurring: str | None = None,
) -> DevLog:
    """`lines` cut in half: the first is the baseline, contaminated with a recurring kind (seeded,
    or `recurring`) at about `contamination` of its lines; the second gets `per_kind` incidents
    of every kind (the recurring one too). `clean`: no injection at all (a clean log, where
    every flag is false)."""
    half = len(lines) // 2
    baseline, scored = lines[:half], lines[half:]
    if clean:
        return DevLog(name, baseline, scored, [0] * len(scored), [None] * len(scored), None)
    fmt = FORMATS[name]
    rng = random.Random(f"{name}:{seed}")
    chosen = rng.choice(RECURRING_KINDS)  # drawn either way: the other draws stay the same
    recurring = recurring or chosen
    dirty = InjectedLog()
    target = contamination * len(baseline)
    plan: list[str] = []
    while len(dirty.lines) - len(baseline) < target:  # each pass adds one occurrence more
        plan.append(recurring)
        dirty = inject(baseline, fmt, plan, random.Random(f"{name}:{seed}:baseline"), label=0)
    kinds = [k for k in KINDS for _ in range(per_kind)]
    rng.shuffle(kinds)
    test = inject(scored, fmt, kinds, rng)
    return DevLog(name, dirty.lines, test.lines, test.labels, test.kinds, recurring)


def strip_label_column(line: str) -> str:
    """Thunderbird's first column is its alert label (`-` = normal): not part of the log."""
    return line.split(" ", 1)[1] if " " in line else line
