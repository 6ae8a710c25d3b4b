"""The model directory: an ordinary HF checkpoint plus `logstream.json`.

Presets are transformers Llama configs. Loading is safe by construction:
safetensors only, never `trust_remote_code`, and a directory that is missing,
foreign or damaged is a `ModelDirError` with one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from logstream.metadata import META_FILE, META_VERSION, ModelDirError, read_model_meta
from logstream.presets import PRESETS
from logstream.tokenizer import LineTokenizer

# Checkpoints with the Llama tensor layout that the engine's own forward can run.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


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


def load_model_dir(directory: Path | str) -> tuple[torch.nn.Module, LineTokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, meta) or a ModelDirError naming what is wrong."""
    directory = Path(directory)
    meta = read_model_meta(directory)
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelDirError(
                f"{directory}: model_type {config.model_type!r} is not supported; "
                f"expected one of {SUPPORTED_MODEL_TYPES}"
            )
        model = AutoModelForCausalLM.from_pretrained(
            directory,
            config=config,
            use_safetensors=True,
            trust_remote_code=False,
            dtype=torch.float32,
        )
        tokenizer = LineTokenizer.load(directory)
    except ModelDirError:
        raise
    except (OSError, ValueError, KeyError, json.JSONDecodeError, SafetensorError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelDirError(f"{directory} could not be loaded: {first_line}") from None
    model.eval()
    return model, tokenizer, meta
