"""A model directory's logstream.json is validated before use.

A real model directory is trained once per module (tiny preset, a few steps); each test
damages a copy of it and checks that loading fails with one clear ModelDirError line (exit 2
from the CLI), never a traceback or a huge allocation.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from logstream.detector import Detector
from logstream.engine.metadata import MAX_SINK_TOKENS, MAX_WINDOW, validate_meta
from logstream.engine.model import META_FILE, ModelDirError, load_model_dir
from logstream.evaluation.synth import generate_lines
from logstream.lifecycle.train import Stream, TrainConfig, save, train
from logstream.records import LogRecord

LOGSTREAM = Path(sys.executable).with_name("logstream")
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model directory, as `logstream train` writes it (tiny, 3 steps)."""
    lines = generate_lines(200, seed=1).lines
    trained = train([Stream("app", lines)], TrainConfig(preset="tiny", window=64, max_steps=3, batch_size=4))
    out = tmp_path_factory.mktemp("model") / "model"
    save(trained, out)
    return out


@pytest.fixture(scope="module")
def meta(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / META_FILE).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of the trained directory, loaded once."""
    model, tokenizer, _ = load_model_dir(model_dir)
    return model, tokenizer


def damaged_copy(model_dir: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of the model directory whose logstream.json went through `edit`.

    `edit` changes the dict in place (returns None) or returns a replacement document."""
    out = tmp_path / "damaged"
    shutil.copytree(model_dir, out)
    meta = json.loads((out / META_FILE).read_text(encoding="utf-8"))
    edited = edit(meta)
    (out / META_FILE).write_text(json.dumps(meta if edited is None else edited), encoding="utf-8")
    return out


def run_replay(model: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`logstream replay <a few lines> --model <model>`, as a user runs it."""
    logs = tmp_path / "app.log"
    logs.write_text("\n".join(generate_lines(20, seed=2).lines) + "\n", encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(LOGSTREAM), "replay", str(logs), "--model", str(model), "--out", str(tmp_path / "scores.jsonl")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=tmp_path,
        check=False,
    )


def test_trained_model_dir_passes_validation(model_dir: Path) -> None:
    """What `logstream train` writes is accepted and scores lines (the schema fits the writer)."""
    detector = Detector.load(model_dir, device="cpu", max_streams=1)
    scored = detector.score([LogRecord(line="GET /health 200", stream="app")])
    assert len(scored) == 1


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda meta: meta.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        del meta[key]

    return edit


def _mask_rule(field: str, value: str) -> Callable[[dict[str, Any]], None]:
    return lambda meta: meta["mask_rules"][0].__setitem__(field, value)


# (edit of logstream.json, text the one error line must contain)
DAMAGE = {
    "missing-window": (_drop("window"), "window: Field required"),
    "window-as-string": (_set("window", "64"), "window: Input should be a valid integer"),
    "window-float": (_set("window", 64.0), "window: Input should be a valid integer"),
    "window-bool": (_set("window", True), "window: Input should be a valid integer"),
    "window-zero": (_set("window", 0), "window: Input should be greater than or equal to 1"),
    "sink-tokens-huge": (_set("sink_tokens", 10**9), "sink_tokens: Input should be less than or equal"),
    "unknown-preset": (_set("preset", "huge"), "preset: unknown 'huge'"),
    "newer-version": (_set("version", 99), "version: 99 is newer than this logstream reads"),
    "bad-regex": (_mask_rule("pattern", "(unclosed"), "mask_rules.0: pattern is not a valid regex"),
    "bad-replacement": (_mask_rule("replacement", "\\9"), "mask_rules.0: replacement is not valid"),
    "mask-rule-extra-field": (
        lambda meta: meta["mask_rules"][0].__setitem__("flags", "i"),
        "mask_rules.0.flags: Extra inputs are not permitted",
    ),
    "prompt-not-strings": (
        _set("pattern_prompt", [1, 2]),
        "pattern_prompt.0: Input should be a valid string",
    ),
    "calibration-list": (_set("calibration", []), "calibration: Input should be a valid dictionary"),
    "calibration-unknown-field": (
        lambda meta: meta["calibration"].__setitem__("no_such_field", 1),
        "calibration: not a calibration:",
    ),
    "sha-not-a-string": (_set("data_sha256", 12), "data_sha256: Input should be a valid string"),
    "stream-key-bad-regex": (_set("stream_key", "(unclosed"), "stream_key: '(unclosed' is"),
    "quiet-baseline-list": (_set("quiet_baseline", []), "quiet_baseline: Input should be a valid dictionary"),
    "quiet-baseline-not-a-rhythm": (
        _set("quiet_baseline", {"web-1 cron": {"gaps": 30}}),
        "quiet_baseline: 'web-1 cron': not a rhythm:",
    ),
    "top-level-list": (lambda meta: [meta], "expected a JSON object, got list"),
}


@pytest.mark.parametrize(("edit", "expected"), list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_metadata_is_one_model_dir_error(
    model_dir: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], Any], expected: str
) -> None:
    """Each damaged field gives a ModelDirError whose one line names the field and the reason."""
    damaged = damaged_copy(model_dir, tmp_path, edit)
    with pytest.raises(ModelDirError) as caught:
        Detector.load(damaged, device="cpu", max_streams=1)
    message = str(caught.value)
    assert "\n" not in message
    assert expected in message
    assert str(damaged / META_FILE) in message


def test_unknown_keys_are_kept_for_newer_writers(model_dir: Path, tmp_path: Path) -> None:
    """Extra keys (top level and in calibration's owner's dict) do not fail loading and survive."""
    damaged = damaged_copy(model_dir, tmp_path, _set("added_by_a_newer_trainer", {"x": [1, 2]}))
    _, _, meta = load_model_dir(damaged)
    assert meta["added_by_a_newer_trainer"] == {"x": [1, 2]}


def test_cli_refuses_a_huge_window_with_exit_2(model_dir: Path, tmp_path: Path) -> None:
    """`window: 1e12` (an 8 TB ring) is refused before any allocation: exit 2, one stderr line."""
    damaged = damaged_copy(model_dir, tmp_path, _set("window", 1e12))
    result = run_replay(damaged, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and "window:" in result.stderr


def test_cli_refuses_a_bad_mask_regex_with_exit_2(model_dir: Path, tmp_path: Path) -> None:
    """A mask rule that does not compile: exit 2 and one line naming the rule, no traceback."""
    damaged = damaged_copy(model_dir, tmp_path, _mask_rule("pattern", "[a-"))
    result = run_replay(damaged, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "mask_rules.0: pattern is not a valid regex" in result.stderr


def test_cli_refuses_truncated_weights_with_exit_2(model_dir: Path, tmp_path: Path) -> None:
    """A truncated model.safetensors: exit 2 and one line saying the directory cannot be loaded."""
    damaged = damaged_copy(model_dir, tmp_path, lambda meta: None)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_replay(damaged, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{damaged} could not be loaded" in result.stderr


def test_deeply_nested_metadata_is_one_model_dir_error(model_dir: Path, tmp_path: Path) -> None:
    """JSON nested past the parser's recursion limit is a damaged file, not a RecursionError."""
    damaged = damaged_copy(model_dir, tmp_path, lambda meta: None)
    (damaged / META_FILE).write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ModelDirError, match="is damaged"):
        load_model_dir(damaged)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(JSON)
def test_arbitrary_json_is_accepted_or_one_model_dir_error(data: Any) -> None:
    """validate_meta on any JSON value raises nothing but ModelDirError (with one line)."""
    try:
        validate_meta(data)
    except ModelDirError as exc:
        assert "\n" not in str(exc)


# Leaves inside the calibration: empty and null containers, numbers of every sign.
PLAUSIBLE_LEAF = st.sampled_from([None, [], {}, "", 0, -1, 1.5, float("inf"), [1.0, "x"], {"x": None}])

# Per field: values near the valid ones (right type, edges of the bounds), so that the
# property also runs the "accepted" branch, not only refusals.
PLAUSIBLE = {
    "version": st.integers(min_value=-1, max_value=3),
    "preset": st.sampled_from(["tiny", "small", "base", "", "TINY"]),
    "window": st.integers(min_value=-1, max_value=MAX_WINDOW + 1),
    "sink_tokens": st.integers(min_value=-1, max_value=MAX_SINK_TOKENS + 1),
    "mask_rules": st.lists(
        st.fixed_dictionaries(
            {"name": st.text(max_size=8), "pattern": st.text(max_size=12), "replacement": st.text(max_size=8)}
        ),
        max_size=3,
    ),
    "pattern_prompt": st.lists(st.text(max_size=40), max_size=4),
    # the calibration is drawn below: one of the real calibration's fields replaced
}


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_what_validation_accepts_the_detector_can_use(
    meta: dict[str, Any], loaded: tuple[Any, Any], data: st.DataObject
) -> None:
    """Fields of a real logstream.json replaced by arbitrary JSON: either ModelDirError, or the
    detector builds from it and scores a line (validation lets nothing through that breaks later)."""
    mutated = copy.deepcopy(meta)
    fields = [*PLAUSIBLE, "calibration"]
    for field in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2, unique=True)):
        if field == "calibration":  # one field of the real calibration, or of a dict inside it
            node, path = mutated["calibration"], "calibration"
            inner = data.draw(st.sampled_from([*sorted(node), "added_field"]), label="in calibration")
            if isinstance(node.get(inner), dict) and data.draw(st.booleans(), label="deeper"):
                node, path = node[inner], f"{path}.{inner}"
                inner = data.draw(st.sampled_from([*sorted(node), "added_field"]), label=f"in {path}")
            node[inner] = data.draw(PLAUSIBLE_LEAF | JSON, label=f"{path}.{inner}")
        else:
            mutated[field] = data.draw(PLAUSIBLE[field] | JSON, label=field)
    try:
        validate_meta(mutated)
    except ModelDirError:
        event("refused")
        return
    event("accepted")
    model, tokenizer = loaded
    detector = Detector(model, tokenizer, mutated, device="cpu", max_streams=1)
    assert len(detector.score([LogRecord(line="GET /health 200 took 12 ms", stream="app")])) == 1
