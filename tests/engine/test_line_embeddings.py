"""Line embeddings from the streaming forward (`StreamingEngine.score_embedded`): the scores
are those of `score`, and a line's embedding is its tokens' mean final-norm hidden state."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from engine_support import VOCAB, tiny_llama

from logstream.engine.streaming import StreamingEngine

SINKS = [1, 5, 9, 13]


def _lines(seed: int) -> dict[str, list[list[int]]]:
    """Three streams of lines of uneven lengths (chunks of 16 cut through them)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate((40, 12, 70)):
        tokens = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
        middle = 9 + (n - 9) // 2
        out[f"s{i}"] = [tokens[:7], tokens[7:9], tokens[9:middle], tokens[middle:]]
    return out


def _engine() -> StreamingEngine:
    # two slots for three streams: a stream is evicted and rebuilt from its tokens
    return StreamingEngine(tiny_llama(2), SINKS, window=32, max_streams=2, chunk_tokens=16, device="cpu")


def test_embedding_leaves_the_scores_unchanged() -> None:
    """The same calls through `score_embedded` give `score`'s token NLLs bit for bit and the
    same next-token log-probs, past the window and across an eviction."""
    plain, embedded = _engine(), _engine()
    for seed in (1, 2):
        lines = _lines(seed)
        want = plain.score(lines)
        got, vectors = embedded.score_embedded(lines)
        for stream, nll in want.items():
            assert all(np.array_equal(a, b) for a, b in zip(nll, got[stream], strict=True))
            assert vectors[stream].shape == (len(lines[stream]), 32)
    for stream, state in plain.streams.items():
        twin = embedded.streams[stream]
        assert torch.equal(plain.next_logprobs[state.slot], embedded.next_logprobs[twin.slot])


def test_a_line_embedding_is_the_mean_final_norm_state_of_its_tokens() -> None:
    """Inside the window, each line's embedding equals the mean of HF's last hidden state
    (after the final norm) over that line's tokens, for every stream of a batch."""
    model = tiny_llama(2)
    engine = StreamingEngine(model, SINKS, window=128, max_streams=4, chunk_tokens=16, device="cpu")
    lines = _lines(3)
    _, vectors = engine.score_embedded(lines)
    for stream, stream_lines in lines.items():
        tokens = [t for line in stream_lines for t in line]
        with torch.no_grad():
            states = model.model(torch.tensor([SINKS + tokens])).last_hidden_state[0, len(SINKS) :]
        bounds = np.cumsum([0, *map(len, stream_lines)])
        want = torch.stack([states[a:b].mean(0) for a, b in itertools.pairwise(bounds)])
        np.testing.assert_allclose(vectors[stream], want.numpy(), atol=1e-4, rtol=1e-4)
