"""Seeded injection of real-looking incidents into a real log, with line labels.

The dev sets of docs/quality.md: take a real syslog-style log (loghub's Linux, OpenSSH,
Thunderbird samples), insert incident lines at seeded random places, and label them 1.
Each injected line borrows the prefix (timestamp, host) of the line it follows, so the
format matches and only the message tells it apart.

Kinds, as the kernel and daemons write them:
- oom:        an OOM kill (`Out of memory: Kill process`, then `Killed process`)
- fs_error:   a failing disk (`EXT3-fs error`, `Buffer I/O error`, `Remounting filesystem read-only`)
- segfault:   a crashing process (`segfault at ... in libc`)
- auth_flood: sshd throttling a connection flood (`MaxStartups` throttling, dropped connections)

`inject_burst` adds one incident of another shape: 30 lines of a failing disk at one place,
as real incidents often write (docs/quality.md, "bursts").

`stop_source` is a daemon that stops logging: its lines are left out from some line on.
No line score can see a line that is not there; `logstream.quiet` watches for it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from logstream.quiet import source_of

INCIDENT_KINDS = ("oom", "fs_error", "segfault", "auth_flood")
# timestamp + host (+ Thunderbird's "- epoch date node" columns and its "node/node" source)
_PREFIX = re.compile(r"^((?:(?:- )?\d+ \d{4}\.\d\d\.\d\d \S+ )?\w{3} +\d+ \d\d:\d\d:\d\d \S+ )")
_PROCS = ("java", "httpd", "mysqld", "python", "postgres", "node")


@dataclass
class InjectedLog:
    lines: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    kinds: list[str | None] = field(default_factory=list)


def incident_messages(kind: str, rng: random.Random) -> list[str]:
    """The message part (after timestamp and host) of one incident of `kind`."""
    pid, proc = rng.randrange(1000, 32000), rng.choice(_PROCS)
    if kind == "oom":
        return [
            f"kernel: Out of memory: Kill process {pid} ({proc}) score {rng.randrange(300, 999)} or sacrifice child",
            f"kernel: Killed process {pid} ({proc}) total-vm:{rng.randrange(10**6, 9 * 10**6)}kB, "
            f"anon-rss:{rng.randrange(10**5, 9 * 10**5)}kB, file-rss:0kB",
        ]
    if kind == "fs_error":
        dev = rng.choice(("sda1", "sdb2", "hda3"))
        return [
            f"kernel: EXT3-fs error (device {dev}): ext3_find_entry: reading directory #{rng.randrange(2, 99999)} offset 0",
            f"kernel: Buffer I/O error on device {dev}, logical block {rng.randrange(10**5, 10**7)}",
            "kernel: Remounting filesystem read-only",
        ]
    if kind == "segfault":
        return [
            f"kernel: {proc}[{pid}]: segfault at {rng.randrange(16**7):x} ip {rng.randrange(16**11):x} "
            f"sp {rng.randrange(16**11):x} error 4 in libc-2.3.4.so[{rng.randrange(16**7):x}+{rng.randrange(16**5):x}]"
        ]
    if kind == "auth_flood":
        ip = ".".join(str(rng.randrange(1, 255)) for _ in range(4))
        return [f"sshd[{pid}]: error: beginning MaxStartups throttling"] + [
            f"sshd[{pid}]: drop connection #{i} from [{ip}]:{rng.randrange(1024, 65535)} on [10.0.0.1]:22 past MaxStartups"
            for i in range(10, 16)
        ]
    raise ValueError(f"kind: unknown {kind!r}; expected one of {INCIDENT_KINDS}")


def inject(lines: list[str], seed: int, per_kind: int = 2, start_fraction: float = 0.0) -> InjectedLog:
    """`lines` with `per_kind` incidents of every kind inserted after seeded random lines
    (none before `start_fraction` of the log)."""
    rng = random.Random(seed)
    first = int(len(lines) * start_fraction)
    places = sorted(rng.sample(range(first, len(lines)), per_kind * len(INCIDENT_KINDS)))
    kinds = [k for k in INCIDENT_KINDS for _ in range(per_kind)]
    rng.shuffle(kinds)
    at = dict(zip(places, kinds, strict=True))
    out = InjectedLog()
    for i, line in enumerate(lines):
        out.lines.append(line)
        out.labels.append(0)
        out.kinds.append(None)
        if i in at:
            match = _PREFIX.match(line)
            prefix = match.group(1) if match else ""
            for message in incident_messages(at[i], rng):
                out.lines.append(prefix + message)
                out.labels.append(1)
                out.kinds.append(at[i])
    return out


def disk_error_burst(prefix: str, n: int) -> list[str]:
    """A failing SCSI disk as the kernel logs it, `n` lines alternating two templates (task
    aborts, SCSI errors): one incident that writes many lines, unlike `inject`'s."""
    return [
        f"{prefix}kernel: mptscsih: ioc0: attempting task abort! (sc={0x5A17 * i:08x})"
        if i % 2 == 0
        else f"{prefix}kernel: sd 0:0:0:0: SCSI error: return code = 0x{0x2B3F * i:08x}"
        for i in range(n)
    ]


def inject_burst(lines: list[str], after: int, n: int = 30) -> InjectedLog:
    """`lines` with a `disk_error_burst` of `n` lines after line `after` (0-based), in its format."""
    match = _PREFIX.match(lines[after])
    burst = disk_error_burst(match.group(1) if match else "", n)
    out = InjectedLog(lines=[*lines[: after + 1], *burst, *lines[after + 1 :]])
    out.labels = [0] * (after + 1) + [1] * n + [0] * (len(lines) - after - 1)
    out.kinds = [None] * (after + 1) + ["disk_burst"] * n + [None] * (len(lines) - after - 1)
    return out


def strip_label_column(line: str) -> str:
    """Thunderbird's first column is its alert label (`-` = normal): not part of the log."""
    return line.split(" ", 1)[1] if " " in line else line


def stop_source(lines: list[str], source: str, after: int) -> list[str]:
    """`lines` without `source`'s lines from line `after` on (0-based): a daemon that stopped
    logging there. Sources are named as `quiet.source_of` names them (`host program`)."""
    return [
        line
        for i, line in enumerate(lines)
        if i < after or (found := source_of(line)) is None or found[0] != source
    ]
