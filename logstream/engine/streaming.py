"""The streaming forward: a Llama decoder over pinned sinks + a per-stream ring cache.

This does not use HF's forward or cache classes. It reads the HF module's
weights and runs its own forward, so that each stream's memory is a fixed ring
of L slots per layer (StreamingLLM) and many streams run in one batch:

    tokens [B, T] -> embed -> L x (attention over sinks + ring + chunk, MLP)
                  -> logits [B, T, V] -> NLL of each next token = logsumexp - logit[target]

`device_step` is that forward as a pure tensor function (compilable, capturable in a CUDA
graph); `_step` wraps it with the host bookkeeping (batching chunks, positions). The
public `step_fn` swaps what `_step` calls for the forward (`torch.compile(engine.device_step)`,
or a wrapper that counts or times it) without touching the engine's insides.

Cache layout (per layer, keys rotated; see kernels/reference.py):
    sink_k, sink_v  [Hkv, S, D]      the pattern prompt at 0..S-1, shared by all streams
    ring_k, ring_v  [N, Hkv, L, D]   one slot per stream, N = max_streams; a key is rotated
                                     once, at its stream position, when it is written

Memory per stream is layers x 2 x L x Hkv x D x bytes (and a [V] row of next-token
log-probs), whatever the stream's length. Streams beyond `max_streams` evict the least
recently used one; an evicted stream that returns is rebuilt from its last L tokens, or,
with `offload=True`, its ring is copied to host memory (pinned when the engine is on a GPU)
and paged back unchanged.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from logstream.engine.allocator import keep_step_memory
from logstream.engine.kernels.dispatch import backend_for, ring_write, sink_ring_attention
from logstream.engine.kernels.flash_cpu import block_fill, window_bias
from logstream.engine.kernels.reference import apply_rope, rope_at

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # with `StreamingEngine.device_step`'s signature
TokenCount = TypeVar("TokenCount", int, np.ndarray)  # `block_len` takes a count or an array of them
# On the CPU (flash_cpu) a step holds up to this many chunks: when fewer streams have tokens
# left, each takes several chunks at once, as blocks of one batch (kernels/flash_cpu.py). A
# lone stream would otherwise run one chunk a step, at a third of the tokens/s of 20 streams
# (docs/benchmarks.md, "Several chunks a step").
CPU_STEP_CHUNKS = 16
# What a step costs besides its rows, in padded token rows: splitting 20 streams' step in two
# cost as much as 280-860 rows (small at L = 2048) and 430 (tiny at L = 128); at 384 and 512
# tiny's replay ran 2-5% slower for one or two more steps (docs/benchmarks.md). A step's streams
# are split (`step_groups`) only where that saves more padding than this.
STEP_ROWS = 768


def block_len(T: TokenCount, chunk_tokens: int) -> TokenCount:
    """Queries per block when a stream brings T tokens to a step (an int, or an array of them):
    ceil(T / chunk_tokens) blocks of equal size, so that T = 535 runs as 3 x 179 rows, not 3 x 256."""
    return -(-T // -(-T // chunk_tokens))


def step_groups(chunk_len: np.ndarray, chunk_tokens: int, step_rows: int = STEP_ROWS) -> list[np.ndarray]:
    """The streams of one step, by their chunk lengths [B], as the steps to run instead: index
    arrays into chunk_len, the longest chunks first.

    A step pads every stream's chunk to its longest one (blocks of `block_len`), so a stream
    with 25 tokens left beside three of 768 costs 768 rows. The groups are runs of the streams
    sorted by length that minimize the rows computed plus `step_rows` a step: a dynamic program
    over the B + 1 places to cut.
    """
    order = np.argsort(chunk_len, kind="stable")
    ascending = chunk_len[order]  # [B]: a run's last stream is its longest
    rows = -(-ascending // chunk_tokens) * block_len(ascending, chunk_tokens)  # [B] blocks x block
    cost = np.zeros(order.size + 1)  # cost[j]: the cheapest steps for the j shortest streams
    start = np.zeros(order.size + 1, dtype=np.int64)  # where the last of those steps starts
    for j in range(1, order.size + 1):
        total = cost[:j] + (j - np.arange(j)) * rows[j - 1]  # the last step takes order[i:j]
        start[j] = int(total.argmin())  # the first minimum: on a tie, fewer steps
        cost[j] = total[start[j]] + step_rows
    groups, j = [], order.size
    while j:  # start[j] < j: the cuts, from the longest streams back
        groups.append(order[start[j] : j])
        j = int(start[j])
    return groups


@dataclass
class RingSlot:
    slot: int  # its row in the engine's per-slot state: rings, `position`, `next_logprobs`
    recent: deque[int] = field(default_factory=deque)  # last L token ids, to rebuild after eviction


# An offloaded stream: its state, host copies of its slot's tensors (`_pools()`, then the [V]
# next log-probs) and its position
Offloaded = tuple[RingSlot, list[torch.Tensor], int]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def next_token_nll(logits: torch.Tensor, tokens: torch.Tensor, fused: bool | None = None) -> torch.Tensor:
    """-log p(each next token) = logsumexp(logits) - logit[target] at each position but the last:
    logits [B, T, V] fp32, tokens [B, T] -> [B, T - 1], position j scoring tokens[:, j + 1].

    `fused` (the default on a CPU) takes torch's log-softmax and gathers: one fused pass, where
    torch's CPU logsumexp makes several (max, subtract, exp, sum, log) and cost 2.5x as much at
    V = 2,048. It runs over the whole contiguous logits: on the [:, :-1] view torch's CPU
    log-softmax took 5x as long (docs/benchmarks.md). On a GPU logsumexp writes no [B, T, V] tensor.
    """
    if fused is None:
        fused = not logits.is_cuda
    targets = tokens[:, 1:, None]  # [B, T - 1, 1]
    if fused:
        return -torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, targets)[..., 0]
    logits = logits[:, :-1]
    return torch.logsumexp(logits, dim=-1) - logits.gather(-1, targets)[..., 0]


def line_means(token_h: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each line's mean row: token_h [N, C], bounds [lines + 1] (line i is rows bounds[i] to
    bounds[i + 1]) -> [lines, C]; 0 for a line without tokens."""
    lengths = np.diff(bounds)  # [lines]
    rows = token_h[bounds[0] : bounds[-1]]  # reduceat's last range runs to the end of its input
    if not rows.shape[0]:
        return np.zeros((lengths.size, token_h.shape[1]), dtype=token_h.dtype)
    sums = np.add.reduceat(rows, np.minimum(bounds[:-1] - bounds[0], rows.shape[0] - 1), axis=0)
    sums[lengths == 0] = 0.0  # reduceat gives an empty range its first row
    return sums / np.maximum(lengths, 1)[:, None]


class StreamingEngine:
    """Batched per-stream scoring with a constant-size cache per stream.

    `score` takes token ids per line for any number of streams and returns
    the surprisal (NLL, nats) of every token given the sinks and the stream's
    window. `chunk_tokens` bounds the tokens per stream per forward step; on the CPU a
    stream may take several chunks in one step when few streams are active (`step_chunks`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        sink_ids: list[int],
        window: int = 2048,
        max_streams: int = 64,
        chunk_tokens: int = 256,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        offload: bool = False,
        int8_ring: bool = False,
        step_chunks: int = CPU_STEP_CHUNKS,
        step_rows: int = STEP_ROWS,
    ) -> None:
        config = model.config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cpu":
            keep_step_memory()  # a step's tensors stay in glibc's heap (allocator.py)
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.eps = config.rms_norm_eps
        self.window = window
        self.max_streams = max_streams
        self.chunk_tokens = min(chunk_tokens, window)
        self.step_chunks = step_chunks  # on the CPU: chunks a step holds in all (`CPU_STEP_CHUNKS`)
        self.step_rows = step_rows  # on the CPU: a step's cost besides its rows (`STEP_ROWS`)
        self.vocab_size = config.vocab_size

        rotary = self.decoder.rotary_emb
        self.inv_freq = rotary.inv_freq.to(self.device)  # [D/2]
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))

        shape = (len(self.layers), max_streams, self.n_kv_heads, window, self.head_dim)
        # int8_ring: K/V quantized per (token, kv head), x = int8 x scale, scale = max|x| / 127
        # (the Triton kernels dequantize as they read; the CPU path dequantizes the batch's rings)
        ring_dtype = torch.int8 if int8_ring else dtype
        self.ring_k = torch.zeros(shape, device=self.device, dtype=ring_dtype)  # [layers, N, Hkv, L, D]
        self.ring_v = torch.zeros(shape, device=self.device, dtype=ring_dtype)
        scale_shape = (*shape[:-1], 1)  # [layers, N, Hkv, L, 1]
        self.ring_scales = (
            (torch.ones(scale_shape, device=self.device), torch.ones(scale_shape, device=self.device))
            if int8_ring
            else None
        )
        self.sink_k, self.sink_v, self.initial_logprobs = self._prefill_sinks(sink_ids)
        # Per slot, so that a step's bookkeeping is a few array operations, not Python per stream
        # (at 1,024 streams on a GPU that Python was most of a call; docs/gpu/README.md):
        self.position = np.zeros(max_streams, dtype=np.int64)  # [N] tokens written (`head`, `fill`)
        self.next_logprobs = torch.zeros(max_streams, self.vocab_size, device=self.device)  # [N, V] fp32
        self.streams: OrderedDict[str, RingSlot] = OrderedDict()  # LRU order
        self.evicted: OrderedDict[str, deque[int]] = OrderedDict()  # recent tokens of evicted
        # offload: evicted streams' rings on the host, [layers, Hkv, L, D] each for K and V
        self.offload = offload
        self.offloaded: OrderedDict[str, Offloaded] = OrderedDict()
        self.free_slots = list(range(max_streams - 1, -1, -1))
        # the device forward each step runs: None is `device_step`; set a callable with its
        # signature that calls it (compiled, counted, timed) to change how, not what, it computes
        self.step_fn: StepFn | None = None

    @property
    def head(self) -> np.ndarray:
        """[N] each slot's next ring slot to write: position mod L."""
        return self.position % self.window

    @property
    def fill(self) -> np.ndarray:
        """[N] each slot's valid ring entries: min(position, L)."""
        return np.minimum(self.position, self.window)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., D] at positions [...] (`reference.rope_at`)."""
        return rope_at(self.inv_freq, positions, self.rope_scaling)

    # -- memory -----------------------------------------------------------------------------

    @property
    def bytes_per_stream(self) -> int:
        """layers x 2 x L x kv_heads x head_dim x dtype size (+ layers x 2 x L x kv_heads x 4 for int8 scales)."""
        scales = 0 if self.ring_scales is None else 2 * self.ring_scales[0][:, 0].numel() * 4
        return 2 * self.ring_k[:, 0].numel() * self.ring_k.element_size() + scales

    @property
    def cache_bytes(self) -> int:
        """Bytes held by the caches of live streams."""
        return len(self.streams) * self.bytes_per_stream

    # -- the model, one layer at a time --------------------------------------------------------

    def _qkv(self, layer: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, C] -> q [B, H, T, D], k and v [B, Hkv, T, D], all before RoPE."""
        B, T, _ = x.shape
        h = rms_norm(x, layer.input_layernorm.weight, self.eps)
        attn = layer.self_attn
        q = attn.q_proj(h).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def _finish_layer(self, layer: torch.nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual adds around o_proj and the SwiGLU MLP. attn_out [B, H, T, D] -> x [B, T, C]."""
        B, _, T, _ = attn_out.shape
        x = x + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
        mlp = layer.mlp
        return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))

    def _logprobs(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] -> log-probabilities [B, T, V] in fp32."""
        h = rms_norm(x, self.decoder.norm.weight, self.eps)
        return F.log_softmax(self.model.lm_head(h).float(), dim=-1)

    @torch.no_grad()
    def _prefill_sinks(
        self, sink_ids: list[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Plain causal forward over the pattern prompt at positions 0..S-1; keep K/V per layer."""
        S = len(sink_ids)
        empty = torch.zeros(self.n_kv_heads, 0, self.head_dim, device=self.device, dtype=self.dtype)
        if S == 0:  # no sinks: the first token is predicted by a uniform distribution
            uniform = torch.full((self.vocab_size,), -float(np.log(self.vocab_size)), device=self.device)
            return [empty] * len(self.layers), [empty] * len(self.layers), uniform
        x = self.decoder.embed_tokens(torch.tensor([sink_ids], device=self.device))  # [1, S, C]
        cos, sin = self.rope(torch.arange(S, device=self.device))  # [S, D]
        sink_k, sink_v = [], []
        for layer in self.layers:
            q, k, v = self._qkv(layer, x)
            k = apply_rope(k, cos, sin)  # stored rotated, at 0..S-1
            sink_k.append(k[0].contiguous())  # [Hkv, S, D]
            sink_v.append(v[0].contiguous())
            out = F.scaled_dot_product_attention(
                apply_rope(q, cos, sin), k, v, is_causal=True, enable_gqa=True
            )  # [1, H, S, D]
            x = self._finish_layer(layer, x, out)
        return sink_k, sink_v, self._logprobs(x)[0, -1]

    def ring_len(self, fill: np.ndarray) -> int:
        """Ring entries any query of a step with these fills [B] can see: min(max fill, L - 1),
        rounded up to 64.

        An entry of age r is visible to query t iff r <= fill and t + r <= L - 1, so older
        entries are skipped exactly (streams that have not filled their ring, e.g. sessions of
        a few hundred tokens, attend over their own length). Rounding up (the extra entries are
        masked) keeps the number of distinct shapes small, for compiled and captured steps.
        """
        return min(-(-int(fill.max()) // 64) * 64, self.window - 1)

    @torch.no_grad()
    def device_step(
        self,
        tokens: torch.Tensor,
        previous: torch.Tensor,
        slots: torch.Tensor,
        position: torch.Tensor,
        chunk_len: torch.Tensor,
        ring_len: int,
        fill_all: bool = False,
        hidden: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pure device step: tensors in, tensors out, the rings written in place.

        tokens [B, T] (padded), previous [B, V] the log-probs that predict each stream's first
        token, slots/position/chunk_len [B] int64 (position: the tokens the stream has written)
        -> (nll [B, T] fp32, 0 at padding; last [B, V] fp32, the log-probs after each stream's
        last real token). No host sync on the Triton path, so it can be compiled or captured in
        a CUDA graph; `ring_len` is a host int (a shape) from `ring_len()` or, for a fixed-shape
        bucket, L - 1. `fill_all`: every stream holds at least `ring_len` entries (a host fact),
        so the CPU path shares one mask. `hidden` (opt-in, `score_embedded`): a list that the
        final-norm hidden states [B, T, C] are appended to; None computes and keeps nothing more.

        Only the target's log-prob is needed per token (`next_token_nll`); full log-probs only for
        the B last positions.
        """
        B, T = tokens.shape
        L, S = self.window, self.sink_k[0].shape[1]
        P = block_len(T, self.chunk_tokens)  # queries per block: T > P only on the CPU (`step_chunks`)
        head, fill = position % L, position.clamp(max=L)  # [B]
        # RoPE (reference.py): the window at the stream's own positions, the sinks' frame at
        # S + W_t - 1; the same for every layer
        t = torch.arange(T, device=tokens.device)
        cos_win, sin_win = (x[:, None] for x in self.rope(position[:, None] + t))  # [B, 1, T, D]
        sink_frame = S + torch.clamp(fill[:, None] + t + 1, max=L) - 1  # [B, T]
        cos_sink, sin_sink = (x[:, None] for x in self.rope(sink_frame))
        bias = None  # the CPU window mask, the same for every layer: built once
        if backend_for(tokens) == "flash_cpu":
            bias = window_bias(
                None if fill_all else block_fill(fill, T, P), P, ring_len, self.window, self.dtype
            )
        x = self.decoder.embed_tokens(tokens).to(self.dtype)  # [B, T, C]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x)  # q [B, H, T, D], k v [B, Hkv, T, D]
            q_win, q_sink = apply_rope(q, cos_win, sin_win), apply_rope(q, cos_sink, sin_sink)
            k = apply_rope(k, cos_win, sin_win)
            rings = (self.ring_k[i], self.ring_v[i])  # [N, Hkv, L, D]
            scales = None if self.ring_scales is None else (self.ring_scales[0][i], self.ring_scales[1][i])
            sinks = (self.sink_k[i], self.sink_v[i])  # [Hkv, S, D]
            out, _ = sink_ring_attention(
                q_win, q_sink, k, v, *sinks, *rings, slots, head, fill, ring_len, bias, P, scales
            )  # [B, H, T, D]
            written_head, written_len = head, chunk_len
            if self.window < T:  # several blocks: only the last L tokens stay in the ring
                k, v, written_head, written_len = self._ring_tail(k, v, head, chunk_len)
            ring_write(*rings, slots, written_head, k, v, written_len, scales)  # int8: quantized
            x = self._finish_layer(layer, x, out)
        h = rms_norm(x, self.decoder.norm.weight, self.eps)  # [B, T, C]
        if hidden is not None:
            hidden.append(h)
        logits = self.model.lm_head(h).float()  # [B, T, V]
        # Token j is predicted by position j - 1; the first by the stream's previous step.
        nll_first = -previous.gather(-1, tokens[:, :1])  # [B, 1]
        nll_rest = next_token_nll(logits, tokens)  # [B, T-1]
        nll = torch.cat([nll_first, nll_rest], dim=1)  # [B, T]
        rows = torch.arange(B, device=tokens.device)
        # [B, V]; a padding row of a bucketed step (chunk_len 0, cuda_graphs.py) reads position 0
        last = torch.log_softmax(logits[rows, (chunk_len - 1).clamp_min(0)], dim=-1)
        padding = torch.arange(T, device=tokens.device)[None] >= chunk_len[:, None]  # [B, T]
        return nll.masked_fill(padding, 0.0), last

    def _ring_tail(
        self, k: torch.Tensor, v: torch.Tensor, head: torch.Tensor, chunk_len: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A chunk's last min(chunk_len, L) tokens and where they go: k, v [B, Hkv, T, D] ->
        ([B, Hkv, L, D] x 2, head [B], len [B]); token i of the chunk goes to (head + i) mod L."""
        L = self.window
        start = (chunk_len - L).clamp(min=0)  # [B]
        index = (start[:, None] + torch.arange(L, device=k.device))[:, None, :, None]  # [B, 1, L, 1]
        index = index.expand(-1, k.shape[1], -1, k.shape[3])  # [B, Hkv, L, D]
        return k.gather(2, index), v.gather(2, index), (head + start) % L, chunk_len - start

    def _step(
        self,
        slots: np.ndarray,
        tokens: np.ndarray,
        chunk_len: np.ndarray,
        hidden: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Host bookkeeping around one device step over a ragged batch: slots [B], tokens [B, T]
        (0 after each chunk), chunk_len [B] -> token NLL [B, T]; the streams' positions and next
        log-probs move on. With `hidden` the step runs `device_step` itself (not `step_fn`,
        whose compiled or captured forward keeps no hidden states) and appends them to it."""
        position, fill = self.position[slots], self.fill[slots]
        # blocks after the first see the L - 1 keys before them (kernels/flash_cpu.py)
        ring_len = self.ring_len(fill) if self.chunk_tokens >= tokens.shape[1] else self.window - 1
        # [3, B]: slots, position, chunk_len; rows contiguous (kernels take pointers)
        cache = torch.from_numpy(np.stack([slots, position, chunk_len])).to(self.device)
        slots_at = cache[0]
        args = (torch.from_numpy(tokens).to(self.device), self.next_logprobs[slots_at], *cache, ring_len,
                bool(fill.min() >= ring_len))  # fmt: skip
        if hidden is None:
            nll, last = (self.step_fn or self.device_step)(*args)
        else:
            nll, last = self.device_step(*args, hidden=hidden)
        self.next_logprobs.index_copy_(0, slots_at, last)
        self.position[slots] = position + chunk_len
        return nll

    # -- streams ---------------------------------------------------------------------------------

    def _acquire(self, stream: str, keep: set[str]) -> tuple[RingSlot, list[int]]:
        """The stream's state (LRU-touched) and tokens to replay unscored if it was evicted."""
        if stream in self.streams:
            self.streams.move_to_end(stream)
            return self.streams[stream], []
        if not self.free_slots:
            self._evict_lru(keep)
        slot = self.free_slots.pop()
        if stream in self.offloaded:  # page its ring back in: exact, no tokens to replay
            state, saved, position = self.offloaded.pop(stream)
            state.slot = slot
            self.position[slot] = position
            for pool, host in zip(self._pools(), saved[:-1], strict=True):
                pool[:, slot].copy_(host, non_blocking=True)  # [layers, Hkv, L, D]
            self.next_logprobs[slot].copy_(saved[-1], non_blocking=True)
            self.streams[stream] = state
            return state, []
        state = RingSlot(slot=slot, recent=deque(maxlen=self.window))
        self.position[slot] = 0
        self.next_logprobs[slot] = self.initial_logprobs
        self.streams[stream] = state
        return state, list(self.evicted.pop(stream, ()))

    def _evict_lru(self, keep: set[str]) -> None:
        """Free the least recently used stream's slot, remembering its ring (offload) or recent tokens."""
        victim = next(s for s in self.streams if s not in keep)
        state = self.streams.pop(victim)
        self.free_slots.append(state.slot)
        if self.offload:
            saved = [self._to_host(t[:, state.slot]) for t in self._pools()]
            saved.append(self._to_host(self.next_logprobs[state.slot]))
            self.offloaded[victim] = (state, saved, int(self.position[state.slot]))
            if len(self.offloaded) <= 16 * self.max_streams:
                return
            victim, (state, *_) = self.offloaded.popitem(last=False)  # bounded: the oldest keeps tokens
        self.evicted[victim] = state.recent
        while len(self.evicted) > 16 * self.max_streams:  # bounded: forget the oldest
            self.evicted.popitem(last=False)

    def _pools(self) -> list[torch.Tensor]:
        """Every per-slot cache tensor, [layers, N, ...]: K, V (and their int8 scales)."""
        return [self.ring_k, self.ring_v, *(self.ring_scales or ())]

    def _to_host(self, x: torch.Tensor) -> torch.Tensor:
        """A host copy of x (pinned when x is on a GPU, so the copies run async both ways)."""
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_cuda)
        return host.copy_(x, non_blocking=x.is_cuda)

    @property
    def offloaded_bytes(self) -> int:
        """Host bytes held by offloaded streams' rings."""
        return len(self.offloaded) * self.bytes_per_stream

    def drop(self, stream: str) -> None:
        """Forget a stream (it closed): free its slot and its history."""
        self.evicted.pop(stream, None)
        self.offloaded.pop(stream, None)
        state = self.streams.pop(stream, None)
        if state is not None:
            self.free_slots.append(state.slot)

    def tokens(self, stream: str) -> list[int]:
        """The stream's last L token ids, the input a rebuild replays; [] for an unknown stream."""
        if stream in self.streams:
            return list(self.streams[stream].recent)
        if stream in self.offloaded:
            return list(self.offloaded[stream][0].recent)
        return list(self.evicted.get(stream, ()))

    def rebuild(self, streams: dict[str, list[int]]) -> None:
        """Set streams up from their last token ids (a restore from the changelog).

        `streams` is least recently used first. The last `max_streams` are re-encoded now
        (their first line then costs what any line costs); the others are kept as evicted
        streams, re-encoded with their next line, as an LRU eviction would have left them.
        Exact while a stream's history fits the window; past it, the oldest replayed
        tokens lose the context they had (the same approximation as an eviction).
        """
        names = [s for s in streams if streams[s]]
        for stream in streams:
            self.drop(stream)
        eager = names[-self.max_streams :]
        for stream in names[: -self.max_streams]:  # [] when all fit
            self.evicted[stream] = deque(streams[stream][-self.window :], maxlen=self.window)
        while len(self.evicted) > 16 * self.max_streams:  # the eviction bound (_evict_lru)
            self.evicted.popitem(last=False)
        if eager:  # the first token's NLL (against the sinks) is computed and dropped
            self._score_group({s: [streams[s][-self.window :]] for s in eager})

    def end_nll(self, stream: str, token_id: int) -> float:
        """Surprisal of `token_id` (end of stream) as the stream's next token."""
        state = self.streams.get(stream)
        logprobs = self.next_logprobs[state.slot] if state is not None else self.initial_logprobs
        return float(-logprobs[token_id])

    def score(self, lines_by_stream: dict[str, list[list[int]]]) -> dict[str, list[np.ndarray]]:
        """Token NLLs for each line of each stream, in order; lines keep their stream's context."""
        return self._score_groups(lines_by_stream, None)

    def score_embedded(
        self, lines_by_stream: dict[str, list[list[int]]]
    ) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray]]:
        """`score`, and each line's embedding from the same forward: the final-norm hidden
        state averaged over the line's tokens, [lines, C] fp32 per stream. A token's state has
        read the line up to it in the stream's context (sinks + window). Its steps run the
        eager `device_step`; `score` keeps no hidden state."""
        embeddings: dict[str, np.ndarray] = {}
        return self._score_groups(lines_by_stream, embeddings), embeddings

    def _score_groups(
        self, lines_by_stream: dict[str, list[list[int]]], embeddings: dict[str, np.ndarray] | None
    ) -> dict[str, list[np.ndarray]]:
        results: dict[str, list[np.ndarray]] = {}
        names = list(lines_by_stream)
        for start in range(0, len(names), self.max_streams):
            group = names[start : start + self.max_streams]
            results.update(self._score_group({s: lines_by_stream[s] for s in group}, embeddings))
        return results

    def _chunks_per_stream(self, active: int) -> int:
        """Chunks each of `active` streams takes in one step: 1, or on the CPU up to
        `step_chunks` in all (a step's rows are stream x block there). Not with an int8
        ring: a later block would see the earlier ones' K/V unrounded, so a stream's scores
        would depend on how many other streams were active."""
        if backend_for(self.ring_k) != "flash_cpu" or self.ring_scales is not None:
            return 1
        return max(1, self.step_chunks // active)

    def _step_groups(self, chunk_len: np.ndarray) -> list[np.ndarray]:
        """The steps that one round of chunks [B] takes (`step_groups`): on the CPU, where a
        padded row costs as much as a real one, streams with few tokens left go in a step of
        their own. One step elsewhere: the GPU's steps are not measured for it."""
        if backend_for(self.ring_k) != "flash_cpu":
            return [np.arange(chunk_len.size)]
        return step_groups(chunk_len, self.chunk_tokens, self.step_rows)

    def _score_group(
        self, lines_by_stream: dict[str, list[list[int]]], embeddings: dict[str, np.ndarray] | None = None
    ) -> dict[str, list[np.ndarray]]:
        """`score` over at most `max_streams` streams; each line's embedding into `embeddings`
        when given (`score_embedded`)."""
        results: dict[str, list[np.ndarray]] = {s: [] for s, lines in lines_by_stream.items() if not lines}
        names = [s for s, lines in lines_by_stream.items() if lines]
        keep = set(names)
        slots, scored_from, pending = [], [], []  # per stream; tokens before scored_from are a rebuild
        for stream in names:
            state, rebuild = self._acquire(stream, keep)
            tokens = rebuild + list(itertools.chain.from_iterable(lines_by_stream[stream]))
            state.recent.extend(tokens)
            slots.append(state.slot)
            scored_from.append(len(rebuild))
            pending.append(tokens)
        # Every stream's tokens end to end in `flat`; a step takes each active stream's next chunk.
        lengths = np.fromiter(map(len, pending), dtype=np.int64, count=len(names))  # [streams]
        starts = np.cumsum(lengths) - lengths
        flat = np.fromiter(itertools.chain.from_iterable(pending), dtype=np.int64, count=int(lengths.sum()))
        slots_of = np.array(slots, dtype=np.int64)
        done = np.zeros_like(lengths)
        steps: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []  # (flat index, real [B, T], nll [B, T])
        hidden: list[torch.Tensor] | None = None if embeddings is None else []  # per step, [B, T, C]
        while (active := np.flatnonzero(done < lengths)).size:
            n = self.chunk_tokens * self._chunks_per_stream(active.size)
            round_len = np.minimum(lengths[active] - done[active], n)  # each active stream's next chunk
            for group in self._step_groups(round_len):  # on the CPU, split by length
                streams, chunk_len = active[group], round_len[group]  # [B]
                first = starts[streams] + done[streams]  # [B] each chunk's first token in `flat`
                index = first[:, None] + np.arange(int(chunk_len.max()))  # [B, T]
                real = index < (first + chunk_len)[:, None]  # [B, T]: the chunk's own tokens, not padding
                tokens = np.where(real, flat[np.minimum(index, flat.size - 1)], 0)
                steps.append((index[real], real, self._step(slots_of[streams], tokens, chunk_len, hidden)))
                done[streams] += chunk_len
        # One device-to-host copy per step, after the last: a copy per stream would wait on the
        # device once per stream (at 1,024 streams on a GPU, most of a call; docs/gpu/README.md).
        token_nll = np.empty(flat.size, dtype=np.float32)
        for index, real, nll in steps:
            token_nll[index] = nll.cpu().numpy()[real]
        for stream, start, skip in zip(names, starts.tolist(), scored_from, strict=True):
            lines = lines_by_stream[stream]
            bounds = itertools.accumulate(map(len, lines), initial=start + skip)  # np.cumsum: 10x slower
            results[stream] = [token_nll[a:b] for a, b in itertools.pairwise(bounds)]
        if hidden is not None and embeddings is not None:
            embeddings.update(
                self._line_embeddings(lines_by_stream, starts, scored_from, steps, hidden, flat.size)
            )
        return results

    def _line_embeddings(
        self,
        lines_by_stream: dict[str, list[list[int]]],
        starts: np.ndarray,
        scored_from: list[int],
        steps: list[tuple[np.ndarray, np.ndarray, torch.Tensor]],
        hidden: list[torch.Tensor],
        tokens: int,
    ) -> dict[str, np.ndarray]:
        """Each line's mean final-norm state [lines, C] per stream, from `_score_group`'s steps
        and their states [B, T, C] (`tokens` positions, as in its `flat`; rebuilt tokens left out)."""
        token_h = np.zeros((tokens, self.decoder.norm.weight.shape[0]), dtype=np.float32)  # [tokens, C]
        for (index, real, _), h in zip(steps, hidden, strict=True):
            token_h[index] = h.float().cpu().numpy()[real]
        out = {s: token_h[:0] for s, lines in lines_by_stream.items() if not lines}
        names = [s for s, lines in lines_by_stream.items() if lines]
        for stream, start, skip in zip(names, starts.tolist(), scored_from, strict=True):
            bounds = np.cumsum([start + skip, *map(len, lines_by_stream[stream])])  # [lines + 1]
            out[stream] = line_means(token_h, bounds)
        return out
