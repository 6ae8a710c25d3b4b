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

`bluegene_log` writes a whole log in BlueGene/L's RAS layout with bursts of alerts (no BGL
sample is here): a smoke test for a format whose alerts many nodes report at once.

`stop_source` is a daemon that stops logging: its lines are left out from some line on.
No line score can see a line that is not there; `logstream.quiet` watches for it.
"""

from __future__ import annotations

import random
import re
import time
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


# A log in BlueGene/L's RAS layout (loghub's BGL, of which there is no sample here): epoch,
# date, node, IBM timestamp, node, then `RAS <component> <level> <message>`. Normal messages
# with their weights, as BGL's most common templates write them; FATAL is not an alert by
# itself there (`ciod: failed to read message prefix`, and each crash's register dump).
_BLUEGENE_NORMAL: tuple[tuple[int, str, str, str], ...] = (
    (30, "KERNEL", "INFO", "instruction cache parity error corrected"),
    (15, "KERNEL", "INFO", "generating core.{core}"),
    (12, "KERNEL", "INFO", "CE sym {sym}, at 0x{hex8}, mask 0x{hex2}"),
    (8, "KERNEL", "INFO", "{small} ddr error(s) detected and corrected on rank 0, symbol {sym}, bit {bit}"),
    (8, "KERNEL", "INFO", "total of {small} ddr error(s) detected and corrected"),
    (6, "KERNEL", "INFO", "{count} double-hummer alignment exceptions"),
    (6, "APP", "FATAL", "ciod: failed to read message prefix on control stream (CioStream socket to {ip}:{port}"),
    (3, "DISCOVERY", "WARNING", "Node card VPD check: U01 node in processor card slot J{slot} do not match. VPD ecid 0x{hex8}, found 0x{hex8}"),
)  # fmt: skip
# Alerts (BGL's alert categories), each one incident that many nodes report within seconds;
# a kernel crash is followed on each node by register-dump lines (FATAL, labelled normal).
BLUEGENE_ALERTS: dict[str, tuple[str, str, bool]] = {
    "KERNDTLB": ("KERNEL", "data TLB error interrupt", True),
    "KERNSTOR": ("KERNEL", "data storage interrupt", True),
    "KERNRTSP": ("KERNEL", "rts panic! - stopping execution", False),
    "KERNMNTF": ("KERNEL", "Lustre mount FAILED : bglio{slot} : block_id : location", False),
    "APPSEV": ("APP", "ciod: Error reading message prefix after LOAD_MESSAGE on CioStream socket to {ip}:{port}: Link has been severed", False),
}  # fmt: skip
_BLUEGENE_DUMP = ("instruction address: 0x{hex8}", "machine check status register: 0x{hex8}")


def bluegene_log(seed: int, n: int = 2000, incidents: int = 10, max_nodes: int = 12) -> InjectedLog:
    """About `n` lines in BlueGene/L's layout, with `incidents` bursts of alerts after the
    first 5%: each a kind of BLUEGENE_ALERTS reported by 1..`max_nodes` nodes in a row (a
    crash's dump lines after each), so alerts come in bursts and recur, as BGL's do."""
    rng = random.Random(seed)
    nodes = [f"R{r:02d}-M{m}-N{c}-C:J{j:02d}-U{u}1" for r in range(8) for m in (0, 1) for c in "0123456789ABCDEF"
             for j in (2, 12, 18) for u in (0, 1)]  # fmt: skip
    places = sorted(rng.sample(range(n // 20, n), incidents))
    at = {i: rng.choice(list(BLUEGENE_ALERTS)) for i in places}  # line -> the alert after it
    epoch = 1117838570
    out = InjectedLog()

    def write(node: str, component: str, level: str, message: str, label: int, kind: str | None) -> None:
        t = epoch + len(out.lines) * 37
        stamp = time.strftime("%Y-%m-%d-%H.%M.%S", time.gmtime(t)) + f".{rng.randrange(10**6):06d}"
        fields = {
            "core": rng.randrange(1, 4000), "sym": rng.randrange(32), "bit": rng.randrange(8),
            "small": rng.randrange(1, 20), "count": rng.randrange(1, 99999), "slot": rng.randrange(2, 19),
            "hex8": f"{rng.randrange(16**8):08x}", "hex2": f"{rng.randrange(256):02x}",
            "ip": f"172.16.96.{rng.randrange(1, 255)}", "port": rng.randrange(1024, 65535),
        }  # fmt: skip
        day = time.strftime("%Y.%m.%d", time.gmtime(t))
        text = message.format(**fields)
        out.lines.append(f"{t} {day} {node} {stamp} {node} RAS {component} {level} {text}")
        out.labels.append(label)
        out.kinds.append(kind)

    weights = [w for w, *_ in _BLUEGENE_NORMAL]
    for i in range(n):
        _, component, level, message = rng.choices(_BLUEGENE_NORMAL, weights)[0]
        write(rng.choice(nodes), component, level, message, 0, None)
        if i in at:
            component, message, crash = BLUEGENE_ALERTS[at[i]]
            for node in rng.sample(nodes, rng.randint(1, max_nodes)):
                write(node, component, "FATAL", message, 1, at[i])
                for dump in _BLUEGENE_DUMP if crash else ():
                    write(node, "KERNEL", "FATAL", dump, 0, None)
    return out
