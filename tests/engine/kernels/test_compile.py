"""The kernels compile for real GPUs (sm_80, sm_90) on a CPU-only machine, without spills.

The interpreter run (tests/engine/kernels/test_triton.py) checks the math, not what only
the compiler sees: dot shape limits, types, pointer alignment, register
pressure. Here each wrapper runs on CPU tensors with its launch recorded
instead of executed; the recorded arguments are specialized exactly as
Triton's JIT specializes them (its own `native_specialize_impl`: ints equal
to 1 become constants, 16-divisible ints and 16-byte aligned pointers are
marked), the kernel is compiled ahead of time for the target, and the
bundled ptxas's resource report must show no stack, i.e. no spilled
registers, which would cost the decode kernel its bandwidth.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
from kernels_support import Case, make_inputs
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource

from logstream.engine.kernels import reference
from logstream.engine.kernels import ring_write as ring_write_module
from logstream.engine.kernels import sink_ring_attention as attention_module

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1",
    reason="TRITON_INTERPRET=1 makes the kernels interpreted functions, which do not compile",
)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
LAUNCH_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")
# Triton 3.6, on the GPU machines, refuses a dot shallower than 16 on sm_90; CI's newer Triton
# takes 8, so the depth is read from the compiled IR: `tt.dot ... : tensor<MxKx..> * ...`.
MIN_DOT_DEPTH = 16
DOT_DEPTH = re.compile(r"tt\.dot [^:]*: tensor<\d+x(\d+)x")


class LaunchRecorder:
    """Stands in for `kernel[grid]` so a wrapper's launch arguments can be compiled, not run."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def compile_launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], capability: int) -> Any:
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if i < len(args):
            ty, key = native_specialize_impl(BaseBackend, args[i], False, True, True)
            signature[name] = ty
            if ty == "constexpr":
                constexprs[name] = args[i]
            elif key:
                attrs[(i,)] = BaseBackend.parse_attr(key)
        else:
            signature[name] = "constexpr"
            constexprs[name] = kwargs[name]
    options = {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def spilled_bytes(compiled: Any) -> int:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run(
            [str(CUOBJDUMP), "-res-usage", cubin.name], capture_output=True, text=True, timeout=60
        ).stdout
    match = re.search(r"STACK:(\d+)", usage)
    assert match, f"no resource usage in cuobjdump output: {usage!r}"
    return int(match.group(1))


def dot_depths(compiled: Any) -> list[int]:
    """The depth K of every `tl.dot` in the kernel, from its Triton IR."""
    return [int(k) for k in DOT_DEPTH.findall(compiled.asm["ttir"])]


def record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> LaunchRecorder:
    recorder = LaunchRecorder(getattr(module, name))
    monkeypatch.setattr(module, name, recorder)
    return recorder


@pytest.mark.parametrize(
    ("dtype", "D", "G", "T", "splits", "int8"),
    [
        (torch.bfloat16, 128, 4, 1, 1, False),  # decode, the bandwidth-bound case
        (torch.bfloat16, 64, 4, 1, 1, False),  # decode at D = 64: three pipeline stages
        (torch.bfloat16, 128, 4, 64, 1, False),  # a chunk: 64-row blocks, 8 warps
        (torch.float16, 64, 4, 1, 4, False),  # split-K: fp32 partial outputs
        (torch.float32, 64, 2, 1, 1, False),  # the engine's default dtype: IEEE fp32 dots
        (torch.float32, 128, 4, 64, 1, False),
        (torch.float32, 16, 2, 64, 1, False),  # the tiny preset's head_dim
        (torch.bfloat16, 16, 4, 1, 1, False),  # the least 16-bit head_dim: q @ k^T of depth 16
        (torch.bfloat16, 128, 4, 1, 1, True),  # an int8 ring, dequantized as it is read
        (torch.bfloat16, 64, 4, 1, 4, True),
    ],
    ids=[
        "bf16-d128-decode",
        "bf16-d64-decode",
        "bf16-d128-chunk",
        "fp16-d64-split4",
        "fp32-d64-decode",
        "fp32-d128-chunk",
        "fp32-d16-chunk",
        "bf16-d16-decode",
        "bf16-d128-decode-int8",
        "bf16-d64-split4-int8",
    ],
)
def test_attention_compiles_for_sm90_without_spills(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, D: int, G: int, T: int, splits: int, int8: bool
) -> None:
    """The attention kernel and the split-K merge, as the wrapper launches them, compile
    for H100/H200 with no spills and no dot shallower than Triton 3.6 compiles."""
    attention = record(monkeypatch, attention_module, "_sink_ring_attention_kernel")
    merge = record(monkeypatch, attention_module, "_merge_splits_kernel")
    x = make_inputs(Case(B=2, H=2 * G, Hkv=2, T=T, D=D, S=4, L=130, dtype=dtype))
    for name in ("q_win", "q_sink"):  # the engine's layout
        x[name] = x[name].transpose(1, 2).contiguous().transpose(1, 2)
    scales = None
    if int8:
        (x["ring_k"], k_scale), (x["ring_v"], v_scale) = map(
            reference.quantize_int8, (x["ring_k"], x["ring_v"])
        )
        scales = (k_scale, v_scale)
    attention_module.sink_ring_attention(**x, num_splits=splits, ring_scales=scales)
    assert len(attention.launches) == 1 and len(merge.launches) == int(splits > 1)
    for recorder in (attention, merge):
        for args, kwargs in recorder.launches:
            compiled = compile_launch(recorder.kernel, args, kwargs, 90)
            assert spilled_bytes(compiled) == 0
            assert min(dot_depths(compiled), default=MIN_DOT_DEPTH) >= MIN_DOT_DEPTH


def test_attention_compiles_for_sm80(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 decode launch also compiles for A100 (sm_80, no wgmma)."""
    recorder = record(monkeypatch, attention_module, "_sink_ring_attention_kernel")
    x = make_inputs(Case(B=2, H=8, Hkv=2, T=1, D=64, S=4, L=130, dtype=torch.bfloat16))
    attention_module.sink_ring_attention(**x)
    ((args, kwargs),) = recorder.launches
    assert spilled_bytes(compile_launch(recorder.kernel, args, kwargs, 80)) == 0


@pytest.mark.parametrize(("T", "int8"), [(1, False), (64, False), (1, True), (64, True)])
def test_ring_write_compiles_for_sm90(monkeypatch: pytest.MonkeyPatch, T: int, int8: bool) -> None:
    """The ring write, as the wrapper launches it (quantizing into an int8 ring or not),
    compiles for sm_90 with no spills."""
    recorder = record(monkeypatch, ring_write_module, "_ring_write_kernel")
    x = make_inputs(Case(B=2, T=T, D=128, L=130, dtype=torch.bfloat16))
    chunk_len = torch.tensor([T, 1])
    scales = None
    if int8:
        x["ring_k"], x["ring_v"] = (torch.zeros(x["ring_k"].shape, dtype=torch.int8) for _ in range(2))
        scales = tuple(torch.ones(*x["ring_k"].shape[:3], 1) for _ in range(2))
    names = ("ring_k", "ring_v", "slots", "head", "k_new", "v_new")
    ring_write_module.ring_write(*(x[n] for n in names), chunk_len, scales)
    ((args, kwargs),) = recorder.launches
    assert spilled_bytes(compile_launch(recorder.kernel, args, kwargs, 90)) == 0
