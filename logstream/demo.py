"""The embedded default: a realistic sample system with incidents, from the seeded generator.

`logstream demo` writes a clean baseline and a later log with injected incidents
(plus their line labels, for evaluation only), trains on the baseline and replays
the incident log, exactly as a user would with `train` and `replay`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from logstream.evaluation.synth import INCIDENT_KINDS, generate_lines

BASELINE_LINES = 6000
INCIDENT_LOG_LINES = 3000


@dataclass(frozen=True)
class DemoFiles:
    baseline: Path
    incidents: Path
    labels: Path


def write_demo_logs(directory: Path, seed: int = 0) -> DemoFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = DemoFiles(directory / "baseline.log", directory / "incidents.log", directory / "incidents.labels")
    files.baseline.write_text("\n".join(generate_lines(BASELINE_LINES, seed=seed + 1).lines) + "\n")
    log = generate_lines(INCIDENT_LOG_LINES, seed=seed + 7, incidents=INCIDENT_KINDS * 2, incident_start=0.2)
    files.incidents.write_text("\n".join(log.lines) + "\n")
    files.labels.write_text("\n".join(map(str, log.labels)) + "\n")
    return files
