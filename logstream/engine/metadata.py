"""The schema of a model directory's `logstream.json`, with bounds.

`logstream.json` comes from a directory that someone else may have written or damaged, so
it is checked before any of it is used: a missing key, a wrong type, a regex that does not
compile or a window that would allocate terabytes is a `ModelDirError` naming the field and
the reason, never a traceback or an allocation. Types are strict (JSON `64.0`, `true` or
`"64"` is not a window). Unknown keys are kept: newer writers may add fields, and an older
reader only checks the ones it uses.

The calibration's inner fields belong to `Calibration.from_json`; it is called here, and what
it raises on a wrong shape of JSON (CALIBRATION_ERRORS) becomes a ModelDirError too.

The directory's content hash (`content_sha256`: the weights, the tokenizer, config.json and
logstream.json) names what a model scores with: the model id carries it, and the model store
records it to find a version whose files changed.

Trade-off: mask rules run on Python's `re` (they use lookbehinds that RE2 lacks), and the
default rules themselves repeat groups, so a nested-quantifier check would refuse them. A
mask rule is only checked to compile; a model directory is trusted not to hold a
catastrophically backtracking pattern beyond that.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from logstream.engine.presets import PRESETS
from logstream.errors import UserError
from logstream.regex import RegexError, compile_safe
from logstream.scoring.calibration import Calibration
from logstream.scoring.quiet import MAX_SOURCES, BaselineRhythm

META_VERSION = 3  # 3: level priors after calibration, exponential or heavier tails
META_FILE = "logstream.json"
VERSIONS = "versions"  # a model store's folder of versions (`model_store`)
# The files that decide how a model directory scores (with its `*.safetensors` weights):
# what `content_sha256` covers. Not the training sample, nor generation_config.json.
CONTENT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", META_FILE)

# Ring slots per stream. The engine allocates layers x streams x kv_heads x window x head_dim
# floats up front, so the bound is what keeps a bad file from asking for terabytes.
MAX_WINDOW = 65536
# The sink prefix is prefilled in one forward pass (attention quadratic in its length).
MAX_SINK_TOKENS = 8192
MAX_MASK_RULES = 256
MAX_PATTERN_CHARS = 4096
MAX_PROMPT_LINES = 4096
# What building a Calibration (or a quiet source's rhythm) from a wrong shape of JSON raises: a
# missing inner field (KeyError), a wrong type (TypeError, AttributeError: `None.items()`), a bad
# value (ValueError).
CALIBRATION_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError)


class ModelDirError(UserError):
    """The model directory is missing, foreign or damaged."""


class MaskRuleMeta(BaseModel):
    """One masking rule; exactly the fields of `logstream.text.normalize.MaskRule`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: StrictStr
    pattern: Annotated[StrictStr, Field(max_length=MAX_PATTERN_CHARS)]
    replacement: StrictStr

    @model_validator(mode="after")
    def _compiles(self) -> MaskRuleMeta:
        try:
            compiled = re.compile(self.pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(f"pattern is not a valid regex: {exc}") from None
        try:
            compiled.sub(self.replacement, "")  # parses the replacement: \\ escapes, group references
        except (re.error, IndexError) as exc:
            raise ValueError(f"replacement is not valid for its pattern: {exc}") from None
        return self


class ModelMeta(BaseModel):
    """The fields of logstream.json that loading and scoring read; other keys are allowed."""

    model_config = ConfigDict(extra="allow", strict=True)

    version: Annotated[StrictInt, Field(ge=1)]
    preset: StrictStr
    window: Annotated[StrictInt, Field(ge=1, le=MAX_WINDOW)]
    sink_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_SINK_TOKENS)]
    mask_rules: Annotated[list[MaskRuleMeta], Field(max_length=MAX_MASK_RULES)]
    pattern_prompt: Annotated[list[StrictStr], Field(max_length=MAX_PROMPT_LINES)]
    calibration: dict[StrictStr, Any]
    data_sha256: StrictStr = ""
    model_id: StrictStr = ""
    stream_key: StrictStr | None = None
    quiet_baseline: Annotated[dict[StrictStr, dict[StrictStr, Any]], Field(max_length=MAX_SOURCES)] = {}

    @field_validator("stream_key")
    @classmethod
    def _key_compiles(cls, stream_key: str | None) -> str | None:
        if stream_key is not None:
            try:
                compile_safe(stream_key)
            except RegexError as exc:
                raise ValueError(f"{stream_key!r} is {exc}") from None
        return stream_key

    @field_validator("quiet_baseline")
    @classmethod
    def _rhythms_load(cls, rhythms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for source, rhythm in rhythms.items():
            try:
                BaselineRhythm.from_json(rhythm)
            except CALIBRATION_ERRORS as exc:
                raise ValueError(f"{source!r}: not a rhythm: {one_line(exc)}") from None
        return rhythms

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version > META_VERSION:
            raise ValueError(f"{version} is newer than this logstream reads (up to {META_VERSION})")
        if version < META_VERSION:
            raise ValueError(
                f"{version} predates calibrated scores (format {META_VERSION}); retrain with `logstream train`"
            )
        return version

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        if preset not in PRESETS:
            raise ValueError(f"unknown {preset!r}; expected one of {sorted(PRESETS)}")
        return preset

    @field_validator("calibration")
    @classmethod
    def _calibration_loads(cls, calibration: dict[str, Any]) -> dict[str, Any]:
        try:
            Calibration.from_json(calibration)
        except CALIBRATION_ERRORS as exc:
            raise ValueError(f"not a calibration: {one_line(exc)}") from None
        return calibration


def validate_meta(meta: Any, source: str = "logstream.json") -> dict[str, Any]:
    """`meta` itself (unchanged, extra keys kept) if it is a usable logstream.json.

    Raises ModelDirError with one line: `<source>: <field>: <reason>`.
    """
    if not isinstance(meta, dict):
        raise ModelDirError(f"{source}: expected a JSON object, got {type(meta).__name__}")
    try:
        ModelMeta.model_validate(meta)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        reason = error["msg"].removeprefix("Value error, ")
        more = exc.error_count() - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ModelDirError(f"{source}: {field}: {one_line(reason)}{suffix}") from None
    except RecursionError:
        raise ModelDirError(f"{source}: nested too deeply") from None
    return meta


def read_model_meta(directory: Path) -> dict[str, Any]:
    """A model directory's checked `logstream.json`, or a ModelDirError naming what is wrong.

    Free of torch and transformers, so that the CLI refuses a wrong path in a fraction of a
    second, before it loads the model code (`model.load_model_dir` reads the weights after).
    """
    if not directory.exists():
        raise ModelDirError(
            f"model directory {directory} does not exist; train one: logstream train LOGS --out {directory}"
        )
    if not directory.is_dir():
        raise ModelDirError(
            f"{directory} is a file, not a model directory; give the directory that "
            f"`logstream train --out` wrote (the one holding {META_FILE})"
        )
    meta_path = directory / META_FILE
    if not meta_path.is_file() and (directory / VERSIONS).is_dir():
        raise ModelDirError(
            f"{directory} is a model store, not one model: give one of its versions "
            f"({directory / VERSIONS}/vNNNN; `logstream models list --store {directory}`)"
        )
    if not meta_path.is_file():
        raise ModelDirError(
            f"{directory} is not a logstream model directory: no {META_FILE} "
            "(a model directory is what `logstream train --out` writes)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ModelDirError(f"{meta_path} is damaged: {exc}") from None
    meta = validate_meta(meta, str(meta_path))
    if not any(directory.glob("*.safetensors")):
        raise ModelDirError(f"{directory} has no .safetensors weights (pickle files are never loaded)")
    return meta


def content_sha256(directory: Path) -> str:
    """SHA-256 over the weights, the tokenizer, config.json and logstream.json (each file's
    name, size and bytes, in a fixed order), read once in 1 MiB blocks: two directories with
    the same hash score alike, and a file changed by one bit changes it."""
    digest = hashlib.sha256()
    paths = [directory / name for name in CONTENT_FILES] + sorted(directory.glob("*.safetensors"))
    try:
        for path in paths:
            if not path.is_file():
                continue
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            with path.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
    except OSError as exc:
        raise ModelDirError(f"{directory}: cannot read {exc.filename}: {exc.strerror}") from None
    return digest.hexdigest()


def one_line(message: object) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    lines = str(message).strip().splitlines()
    return lines[0] if lines else type(message).__name__
