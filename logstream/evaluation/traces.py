"""Synthetic process traces: long event sequences with short attack stretches, labelled by session.

A host's programs make system calls; each program is a sparse Markov chain over call numbers
(each call has a few likely successors, and now and then any call of the program follows:
rare, normal transitions that a long trace has more of). A trace is one session, one call a
line, as ADFA-LD writes them. An attack trace is a normal trace of the same program with a
short stretch (15-40 calls) of another pattern inside it: calls that the host's programs all
make in normal traces, a shell's among them (`execve`, `dup2`, `pipe`), in orders the
program never uses. No call of an attack is new; only its order is. Traces run from 100 to
4,000 calls, so a score that averages over a session, or one whose normal level grows with
length, is put to the test.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

PROGRAMS = 6
CALLS = 80  # call numbers 1..CALLS
SHELL_CALLS = [11, 63, 42, 37, 5, 3, 4]  # execve, dup2, pipe, kill, open, read, write: a shell's calls
RARE_JUMP = 0.01  # the share of transitions to any call of the program


@dataclass(frozen=True)
class Trace:
    session: str
    lines: list[str]
    label: int  # 1: the trace holds an attack stretch


class _Program:
    def __init__(self, rng: random.Random, calls: list[int] | None = None) -> None:
        self.calls = calls or rng.sample(range(1, CALLS + 1), rng.randrange(15, 26))
        self.next = {
            c: (rng.sample(self.calls, rng.randrange(2, 5)), [rng.random() + 0.1 for _ in range(4)])
            for c in self.calls
        }

    def run(self, rng: random.Random, n: int) -> list[int]:
        call, out = self.calls[0], []
        for _ in range(n):
            out.append(call)
            if rng.random() < RARE_JUMP:
                call = rng.choice(self.calls)
            else:
                successors, weights = self.next[call]
                call = rng.choices(successors, weights[: len(successors)])[0]
        return out


def _length(rng: random.Random) -> int:
    return int(min(4000, max(100, math.exp(rng.gauss(math.log(500), 0.8)))))


def _attack(rng: random.Random, program: _Program) -> list[int]:
    """Calls of the shell and of the attacked program, in an order neither uses."""
    pool = [*SHELL_CALLS, *rng.sample(program.calls, 4)]
    return [rng.choice(pool) for _ in range(rng.randrange(15, 41))]


def traces(seed: int, normal: int, attacks: int, prefix: str = "trace") -> list[Trace]:
    """`normal` normal traces and `attacks` attack traces, shuffled; the programs are fixed by
    `seed`'s system (the same for every call with that seed), the traces by `prefix` too."""
    system = random.Random(f"traces:{seed}")
    programs = [_Program(system) for _ in range(PROGRAMS - 1)]
    programs.append(_Program(system, SHELL_CALLS))  # the shell: its calls are everyday ones
    rng = random.Random(f"traces:{seed}:{prefix}")
    kinds = [0] * normal + [1] * attacks
    rng.shuffle(kinds)
    out = []
    for i, label in enumerate(kinds):
        program = rng.choice(programs)
        calls = program.run(rng, _length(rng))
        if label:
            at = rng.randrange(len(calls) // 4, len(calls))
            calls = calls[:at] + _attack(rng, program) + calls[at:]
        out.append(Trace(f"{prefix}-{i:05d}", [str(c) for c in calls], label))
    return out
