"""The model directory: an ordinary HF checkpoint plus `logstream.json`.

Presets are transformers Llama configs. Loading is safe by construction:
safetensors only, never `trust_remote_code`, and a directory that is missing,
foreign or damaged is a `ModelDirError` with one clear line. Before any weight is
read, config.json is checked (sizes positive, heads dividing the hidden size and
the key/value heads dividing the heads) and held against the tensors that the
safetensors headers list, name by name and shape by shape, and the tokenizer
against the vocabulary: a config that does not fit its weights is refused by name,
never loaded half-initialised or allocated at a size the weights do not have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PretrainedConfig
from transformers.utils import logging as hf_logging

from logstream.engine.metadata import (
    META_FILE,
    META_VERSION,
    ModelDirError,
    content_sha256,
    one_line,
    read_model_meta,
)
from logstream.engine.presets import PRESETS
from logstream.engine.tokenizer import LineTokenizer

# Checkpoints with the Llama tensor layout that the engine's own forward can run.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# config.json fields that size the weights and the cache: each must be a positive integer.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


# Our CLI shows its own progress; HF's per-file bars ("Writing model shards") are noise on stderr.
hf_logging.disable_progress_bar()


def build_model(preset: str, tokenizer: LineTokenizer, max_positions: int) -> LlamaForCausalLM:
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}; expected one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.layers,
        num_attention_heads=p.heads,
        num_key_value_heads=p.kv_heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.hf.pad_token_id,
    )
    return LlamaForCausalLM(config)


def save_model_dir(
    directory: Path, model: LlamaForCausalLM, tokenizer: LineTokenizer, meta: dict[str, Any]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory)
    (directory / META_FILE).write_text(json.dumps({"version": META_VERSION, **meta}, indent=2))


def model_id(model_dir: Path | str) -> str:
    """`<directory name>@<12 hex of its content hash>`: the hash covers the weights, the
    tokenizer, config.json and logstream.json (`metadata.content_sha256`), so two models
    that differ in any of them never share an id, even when trained on the same data."""
    directory = Path(model_dir)
    return f"{directory.name}@{content_sha256(directory)[:12]}"


def read_config(directory: Path) -> PretrainedConfig:
    """config.json, checked before anything is sized by it; a ModelDirError naming the field."""
    path = directory / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelDirError(f"{path} is unreadable: {one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    heads = raw.get("num_attention_heads")
    sizes = {key: raw.get(key) for key in SIZE_FIELDS}
    sizes["num_key_value_heads"] = raw.get("num_key_value_heads", heads)
    if raw.get("head_dim") is not None:
        sizes["head_dim"] = raw["head_dim"]
    for key, value in sizes.items():
        if type(value) is not int or value <= 0:  # JSON true or 64.0 is not a size either
            raise ModelDirError(f"{path}: {key}: {value!r} is not a positive integer")
    if heads % sizes["num_key_value_heads"]:
        raise ModelDirError(
            f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
            f"{sizes['num_key_value_heads']}"
        )
    if "head_dim" not in sizes and raw["hidden_size"] % heads:
        raise ModelDirError(f"{path}: hidden_size {raw['hidden_size']} is not divisible by {heads} heads")
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except Exception as exc:  # transformers' own checks raise many types: each is a bad config.json
        raise ModelDirError(f"{path}: {one_line(exc)}") from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelDirError(
            f"{directory}: model_type {config.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
        )
    return config


def check_weights(directory: Path, config: PretrainedConfig) -> None:
    """The safetensors files hold exactly the tensors of the model `config` builds, each of
    its shape (a tied copy, like the output head of tied embeddings, may be left out); read
    from the files' headers, and the model built on the meta device, so nothing is allocated."""
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # a config transformers accepts but cannot build a model from
        raise ModelDirError(
            f"{directory}/config.json: no model can be built from it: {one_line(exc)}"
        ) from None
    expected: dict[str, list[int]] = {}
    tied: set[str] = set()
    owners: set[int] = set()
    for name, tensor in skeleton.state_dict(keep_vars=True).items():
        if id(tensor) in owners:
            tied.add(name)
        owners.add(id(tensor))
        expected[name] = list(tensor.shape)
    found: dict[str, tuple[list[int], str]] = {}  # tensor name -> (shape, file)
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(path, framework="pt") as weights:
                for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    found[name] = (list(weights.get_slice(name).get_shape()), path.name)
        except Exception as exc:  # SafetensorError for a truncated or foreign file, OSError
            raise ModelDirError(f"{directory} could not be loaded: {path.name}: {one_line(exc)}") from None
    problems = [
        f"{name} is missing from the weights" for name in expected if name not in found and name not in tied
    ]
    problems += [
        f"{name} is {shape} in {file}, config.json makes it {expected[name]}"
        for name, (shape, file) in found.items()
        if name in expected and shape != expected[name]
    ]
    problems += [
        f"{name} in {file} has no place in config.json's model"
        for name, (_, file) in found.items()
        if name not in expected
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelDirError(f"{directory}: the weights do not fit config.json: {problems[0]}{more}")


def load_tokenizer(directory: Path, config: PretrainedConfig) -> LineTokenizer:
    """The directory's tokenizer, which must have one id per row of the model's vocabulary."""
    try:
        tokenizer = LineTokenizer.load(directory)
    except Exception as exc:  # tokenizers raises its own Exception for a damaged tokenizer.json
        raise ModelDirError(f"{directory}/tokenizer.json is damaged: {one_line(exc)}") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise ModelDirError(
            f"{directory}/tokenizer.json has {tokenizer.vocab_size} tokens, the model's vocabulary "
            f"(config.json vocab_size) {config.vocab_size}: the tokenizer of another model"
        )
    if tokenizer.bos_id is None or tokenizer.eos_id is None:
        raise ModelDirError(f"{directory}/tokenizer.json has no bos or eos token")
    return tokenizer


def load_model_dir(directory: Path | str) -> tuple[torch.nn.Module, LineTokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, meta) or a ModelDirError naming what is wrong."""
    directory = Path(directory)
    meta = read_model_meta(directory)
    config = read_config(directory)
    check_weights(directory, config)
    tokenizer = load_tokenizer(directory, config)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            directory, config=config, use_safetensors=True, trust_remote_code=False, dtype=torch.float32
        )
    except Exception as exc:  # checked above; what is left is a file that changed or failed to read
        raise ModelDirError(f"{directory} could not be loaded: {one_line(exc)}") from None
    model.eval()
    return model, tokenizer, meta
