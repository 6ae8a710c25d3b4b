"""`--help` tells the truth: every command named at the top, documented defaults equal to the
real ones, no development history. Read from the command tree itself (nothing runs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer

from logstream.cli import app
from logstream.lifecycle.train import AUTO_SMALL_LINES, TrainConfig
from logstream.scoring.config import DEFAULT_FALSE_ALARM_RATE
from logstream.scoring.evidence import LINE_TOP_K

# "Default: 2048", "Default: the model's (0.001)", "Default: 3, and ..."
DOCUMENTED = re.compile(r"Default: (?:the model's \()?(\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)")
# Options whose real default is None (decided at run time), and the value their help promises.
RUN_TIME_DEFAULTS = {
    "window": TrainConfig().window,
    "false_alarm_rate": DEFAULT_FALSE_ALARM_RATE,
    "line_top_k": LINE_TOP_K,
}
HISTORY = re.compile(r"\b(?:stop|issue|session|round) \d+\b|\bbefore stop\b", re.IGNORECASE)


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(name, command) of every command under `group`, subcommands included (typer's click)."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


ROOT: Any = typer.main.get_command(app)
OPTIONS = [
    (f"{where} --{option.name}", option)
    for where, command in commands(ROOT)
    for option in command.params
    if getattr(option, "help", None) and DOCUMENTED.search(option.help)
]


def test_the_top_level_help_names_every_command() -> None:
    """`logstream --help`'s text names each command (tail, demo, models ... too)."""
    text = ROOT.help or ""
    assert [name for name in ROOT.commands if not re.search(rf"\b{name}\b", text)] == []


def test_options_that_document_a_default_are_found() -> None:
    """The scan below sees the options that state a default in their help."""
    names = {name.split(" --")[1] for name, _ in OPTIONS}
    assert {"window", "false_alarm_rate", "line_top_k"} <= names


@pytest.mark.parametrize(("name", "option"), OPTIONS, ids=[name for name, _ in OPTIONS])
def test_a_documented_default_is_the_real_default(name: str, option: Any) -> None:
    """The default an option's help states is the one it has (or, decided at run time, the
    one the code uses), so `Default: 2048` never sits beside `[default: 128]`."""
    documented = float(DOCUMENTED.search(option.help or "").group(1).replace(",", ""))  # type: ignore[union-attr]
    real = option.default if option.default is not None else RUN_TIME_DEFAULTS[option.name or ""]
    assert documented == pytest.approx(float(real))


def test_the_auto_preset_threshold_is_the_one_training_uses() -> None:
    """--preset's help says where auto switches from tiny to small: the training code's number."""
    train = ROOT.commands["train"]
    (preset,) = (p for p in train.params if p.name == "preset")
    assert f"{AUTO_SMALL_LINES:,}" in (preset.help or "")  # type: ignore[attr-defined]


def test_help_texts_carry_no_development_history() -> None:
    """No help text or command description speaks of stops, issues or sessions."""
    texts = [ROOT.help or ""]
    for _, command in commands(ROOT):
        texts += [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    assert [t for t in texts if HISTORY.search(t)] == []
