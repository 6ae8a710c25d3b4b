"""The model's own embedding of log lines, for the incident memory: no model of its own.

A line's embedding is the detector model's final-norm hidden state averaged over the
line's tokens (`StreamingEngine.score_embedded`): the same forward that scores lines, so
any model directory serve can load embeds too. `LineEmbedder` runs it without a Detector:
each line alone after the model's sinks (its pattern prompt), so that the same text gets
the same vector whatever came before it (an operator's search, a line from an alert).

Vectors of different models do not compare: each carries its model's `embedding_space`
(its training data and creation time), and retrieval compares only vectors of one space.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logstream.engine.model import load_model_dir
from logstream.engine.streaming import StreamingEngine
from logstream.engine.tokenizer import LineTokenizer, prompt_ids
from logstream.memory.store import Embedding
from logstream.text.normalize import Normalizer


def embedding_space(meta: Mapping[str, Any]) -> str:
    """The name of a model's embedding space, from its `logstream.json`: two models share
    it only when trained on the same data at the same time (one model, copied)."""
    return f"{str(meta.get('data_sha256', ''))[:12]}@{meta.get('created_at', '')}"


def incident_embedding(space: str, line_vectors: np.ndarray) -> Embedding:
    """An incident's vector from its lines' [n, C]: their mean."""
    return Embedding(space, line_vectors.mean(axis=0).astype(np.float32))


class LineEmbedder:
    """Embeds lines with a loaded model directory (`load`), or a detector's model (pass its
    engine's device and dtype): `embed(lines)` -> [n, C] fp32."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: LineTokenizer,
        meta: Mapping[str, Any],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_streams: int = 16,
    ) -> None:
        self.tokenizer = tokenizer
        self.normalizer = Normalizer.from_json(meta["mask_rules"])
        self.space = embedding_space(meta)
        sink_ids = prompt_ids(tokenizer, meta["pattern_prompt"], meta["sink_tokens"])
        # a stream holds one line: a window of one line's tokens gives the same states as the
        # model's own window, in a ring a fraction of its size
        window = min(meta["window"], tokenizer.max_line_tokens)
        # the model's own device and dtype: a detector's model is shared, never moved or cast
        self.engine = StreamingEngine(
            model, sink_ids, window=window, max_streams=max_streams, device=device, dtype=dtype
        )

    @classmethod
    def load(cls, model_dir: Path | str, **options: Any) -> LineEmbedder:
        """From a model directory; ModelDirError (one line) if it is unusable."""
        model, tokenizer, meta = load_model_dir(model_dir)
        return cls(model, tokenizer, meta, **options)

    def embed(self, lines: Sequence[str]) -> np.ndarray:
        """Each line's embedding [n, C], each line scored alone (a stream of its own)."""
        ids = self.tokenizer.encode_lines([self.normalizer.mask(line) for line in lines])
        width = self.engine.decoder.norm.weight.shape[0]
        out = np.zeros((len(lines), width), dtype=np.float32)
        batch = self.engine.max_streams
        for start in range(0, len(ids), batch):
            streams = {str(i): [ids[i]] for i in range(start, min(start + batch, len(ids)))}
            _, embeddings = self.engine.score_embedded(streams)
            for name, vectors in embeddings.items():
                out[int(name)] = vectors[0]
                self.engine.drop(name)
        return out

    def embed_incident(self, lines: Sequence[str]) -> Embedding:
        """One vector for a group of lines (an incident's, or an operator's query)."""
        return incident_embedding(self.space, self.embed(lines))
