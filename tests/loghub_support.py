"""The loghub samples (../shared/data/loghub beside the repository): 2,000 lines of each of
15 real systems' logs. Tests that read them skip where the data is not."""

from __future__ import annotations

from pathlib import Path

import pytest

LOGHUB = Path(__file__).resolve().parents[2] / "shared" / "data" / "loghub"
SAMPLES = sorted(LOGHUB.glob("*_2k.log")) if LOGHUB.is_dir() else []
needs_loghub = pytest.mark.skipif(not SAMPLES, reason=f"loghub samples not found at {LOGHUB}")


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()
