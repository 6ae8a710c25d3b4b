"""Retrieval: the k kept incidents most like a new one, by brute force over all of them.

The similarity of a kept incident x to a query q (a new incident, or an operator's text):

    template(q, x)  = |W(q) & W(x)| / |W(q) | W(x)|    Jaccard of their words
    embedding(q, x) = max(0, cos(v(q), v(x)))          when both vectors come from one model
                    = template(q, x)                   otherwise (no vector to compare)
    score(q, x)     = w * template + (1 - w) * embedding + stream_bias * [x was on q's stream]

W(.) are the words of an incident's templates and example lines, lower-cased, without the
masks (`<NUM>`, `<IP>`, `<*>` ...): what the log says, not its variables. v(.) is the
model's own view of the incident's first lines: the mean of each line's final-norm hidden
states (`StreamingEngine.score_embedded`). `w` is `template_weight`.

Brute force, exactly: the template part is a count over an inverted index (word -> rows),
the embedding part one matrix-vector product per model; both run over every kept row in
numpy. docs/incident_memory.md measures the cost at 10k and 100k incidents.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from logstream.lifecycle.feedback import Feedback
from logstream.memory.settings import IncidentMemorySettings
from logstream.memory.store import MAX_TEXT, Embedding, Incident, IncidentStore, verdicts_on
from logstream.text.normalize import Normalizer

_NORMALIZER = Normalizer()  # the default masking rules, for example lines
_MASK = re.compile(r"<[A-Z_]+>|<\*>")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]+")
COMPACT_AT = 1024  # removed rows an index keeps before it rebuilds (and at least as many as live)
MAX_VERDICTS = 5  # verdicts a past incident carries in an alert: the latest ones


def text_words(texts: Iterable[str]) -> frozenset[str]:
    """The words of masked texts (templates, lines): letters first, two characters or more,
    lower-cased; masks left out. Interned: 100k incidents share one copy of each word."""
    return frozenset(sys.intern(w.lower()) for text in texts for w in _WORD.findall(_MASK.sub(" ", text)))


def incident_words(incident: Incident) -> frozenset[str]:
    """What retrieval compares of an incident's text: the words of its templates and of its
    example lines (masked by the default rules). The lines count too because a template
    can keep none of its line's words: Drain may widen it to wildcards (`<TS> I <*> <*> <*>`)."""
    return text_words((*incident.templates, *map(_NORMALIZER.mask, incident.examples)))


def unit(vector: np.ndarray) -> np.ndarray:
    """vector / |vector| in fp32 (a zero vector stays zero)."""
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def _grow(a: np.ndarray, size: int) -> np.ndarray:
    """`a` with room for `size` rows (doubling)."""
    if size <= a.shape[0]:
        return a
    out = np.zeros((max(size, 2 * a.shape[0], 64), *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@dataclass
class _Vectors:
    """One model's unit vectors: index rows [n] and their vectors [n, C]."""

    rows: np.ndarray  # int64
    matrix: np.ndarray  # fp32
    n: int = 0
    at: dict[int, int] = field(default_factory=dict)  # index row -> position
    aligned: bool = True  # rows[i] == i for every i < n: the similarities need no scatter


@dataclass(frozen=True)
class _Indexed:
    """What a row remembers to be updated or rebuilt (its vector is in `_vectors[space]`);
    tuples, not sets: at 100k rows a set per row would be most of the index's memory."""

    fingerprint: str
    words: tuple[str, ...]
    streams: tuple[str, ...]
    first_seen: float
    space: str | None


class IncidentIndex:
    """Kept incidents as arrays for brute-force similarity (see the module doc). An incident
    added again (its group grew) updates its row in place; a removed one is masked, and the
    arrays are rebuilt once removed rows outnumber live ones (so memory stays within twice
    the live rows)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._entries: list[_Indexed | None] = []
        self._row: dict[str, int] = {}
        self._alive = np.zeros(0, dtype=bool)
        self._first_seen = np.zeros(0)
        self._sizes = np.zeros(0, dtype=np.float32)  # words per row
        self._postings: dict[str, array] = {}  # word -> rows (int32)
        self._streams: dict[str, array] = {}  # stream -> rows
        self._vectors: dict[str, _Vectors] = {}  # embedding space -> its rows' vectors
        self._removed = 0

    def __len__(self) -> int:
        return len(self._row)

    @property
    def capacity(self) -> int:
        """Rows the arrays hold room for (live, removed and spare)."""
        return int(self._alive.shape[0])

    def add(self, incident: Incident) -> None:
        """Add an incident, or update its row with what it holds now."""
        vector = incident.embedding
        entry = _Indexed(
            incident.fingerprint, tuple(incident_words(incident)), incident.streams,
            incident.first_seen, vector.space if vector is not None else None,
        )  # fmt: skip
        self._add(entry, Embedding(vector.space, unit(vector.vector)) if vector is not None else None)

    def _add(self, entry: _Indexed, embedding: Embedding | None) -> None:
        row = self._row.get(entry.fingerprint)
        if row is None:
            row = len(self._entries)
            self._entries.append(None)
            self._row[entry.fingerprint] = row
            self._alive = _grow(self._alive, row + 1)
            self._first_seen = _grow(self._first_seen, row + 1)
            self._sizes = _grow(self._sizes, row + 1)
        held = self._entries[row]
        self._entries[row] = entry
        self._alive[row] = True
        self._first_seen[row] = entry.first_seen
        self._sizes[row] = len(entry.words)
        for word in set(entry.words).difference(held.words if held else ()):
            self._postings.setdefault(word, array("i")).append(row)
        for stream in set(entry.streams).difference(held.streams if held else ()):
            self._streams.setdefault(stream, array("i")).append(row)
        if embedding is not None:
            self._set_vector(row, embedding)

    def _set_vector(self, row: int, embedding: Embedding) -> None:
        vectors = self._vectors.get(embedding.space)
        if vectors is None:
            width = embedding.vector.shape[0]
            vectors = self._vectors[embedding.space] = _Vectors(
                np.zeros(0, np.int64), np.zeros((0, width), np.float32)
            )
        if vectors.matrix.shape[1] != embedding.vector.shape[0]:
            return  # a damaged row: another width under the same model
        position = vectors.at.get(row)
        if position is None:
            position = vectors.at[row] = vectors.n
            vectors.n += 1
            vectors.rows = _grow(vectors.rows, vectors.n)
            vectors.matrix = _grow(vectors.matrix, vectors.n)
            vectors.rows[position] = row
            vectors.aligned &= position == row
        vectors.matrix[position] = embedding.vector

    def remove(self, fingerprints: Iterable[str]) -> None:
        for fingerprint in fingerprints:
            row = self._row.pop(fingerprint, None)
            if row is not None:
                self._alive[row] = False
                self._entries[row] = None
                self._removed += 1
        if self._removed > max(COMPACT_AT, len(self._row)):
            self._rebuild()

    def _rebuild(self) -> None:
        live = [(e, self._vector(row, e.space)) for row, e in enumerate(self._entries) if e is not None]
        self._reset()
        for entry, embedding in live:
            self._add(entry, embedding)

    def _vector(self, row: int, space: str | None) -> Embedding | None:
        """A row's unit vector, if it has one."""
        vectors = self._vectors.get(space) if space is not None else None
        if space is None or vectors is None or row not in vectors.at:
            return None
        return Embedding(space, vectors.matrix[vectors.at[row]].copy())

    def scores(
        self,
        words: frozenset[str],
        embedding: Embedding | None,
        stream: str | None,
        settings: IncidentMemorySettings,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(score, template, embedding similarity) of every row [rows] fp32; removed rows
        score -inf. fp32 and few passes: at 100k rows each pass over them is a cost."""
        n = len(self._entries)
        hits = [np.frombuffer(self._postings[w], dtype=np.int32) for w in words if w in self._postings]
        shared = (
            np.bincount(np.concatenate(hits), minlength=n).astype(np.float32)
            if hits
            else np.zeros(n, np.float32)
        )
        union = (self._sizes[:n] + np.float32(len(words))) - shared  # >= shared, 0 only when both are empty
        template = shared / np.maximum(union, np.float32(1))
        similar = template.copy()
        vectors = self._vectors.get(embedding.space) if embedding is not None else None
        if (
            embedding is not None
            and vectors is not None
            and vectors.matrix.shape[1] == embedding.vector.shape[0]
        ):
            cosine = vectors.matrix[: vectors.n] @ unit(embedding.vector)  # [m]
            np.maximum(cosine, 0.0, out=cosine)
            if vectors.n == n and vectors.aligned:  # every row has a vector of this model, in order
                similar = cosine
            else:
                similar[vectors.rows[: vectors.n]] = cosine
        w = np.float32(settings.template_weight)
        score = similar * (1 - w)
        score += w * template
        if settings.stream_bias and stream in self._streams:
            score[np.frombuffer(self._streams[stream], dtype=np.int32)] += settings.stream_bias
        if self._removed:
            score[~self._alive[:n]] = -np.inf
        return score, template, similar

    def nearest(
        self,
        words: frozenset[str],
        embedding: Embedding | None,
        settings: IncidentMemorySettings,
        *,
        stream: str | None = None,
        before: float | None = None,
        exclude: str | None = None,
    ) -> list[tuple[str, float, float, float]]:
        """The `settings.k` best rows, best first, as (fingerprint, score, template, embedding);
        only incidents first seen before `before` when given, never `exclude`, never one with
        nothing in common (score 0)."""
        score, template, similar = self.scores(words, embedding, stream, settings)
        if before is not None:
            score[self._first_seen[: score.size] >= before] = -np.inf
        if exclude is not None and exclude in self._row:
            score[self._row[exclude]] = -np.inf
        k = min(settings.k, score.size)
        if not k:
            return []
        top = np.argpartition(score, score.size - k)[score.size - k :]
        top = top[np.argsort(-score[top], kind="stable")]
        out = []
        for row in top.tolist():
            entry = self._entries[row]
            if score[row] > 0 and entry is not None:  # -inf: not a candidate; 0: nothing in common
                out.append((entry.fingerprint, float(score[row]), float(template[row]), float(similar[row])))
        return out


@dataclass(frozen=True)
class PastIncident:
    """A kept incident returned by a lookup: how alike it is, what operators said, and its
    link (`IncidentMemorySettings.link`, when one is set)."""

    incident: Incident
    similarity: float
    template_similarity: float
    embedding_similarity: float
    verdicts: tuple[Feedback, ...] = ()
    url: str = ""

    def to_json(self) -> dict[str, object]:
        """What an alert carries of it: when, where, what, and what was said and done."""
        i = self.incident
        out: dict[str, object] = {
            "fingerprint": i.fingerprint,
            "similarity": round(self.similarity, 4),
            "template_similarity": round(self.template_similarity, 4),
            "embedding_similarity": round(self.embedding_similarity, 4),
            "starts_at": i.starts_at,
            "ends_at": i.ends_at,
            "streams": list(i.streams),
            "templates": list(i.templates),
            "example": i.examples[0] if i.examples else "",
            "state": i.state,
            "resolution": i.resolution,
            "resolved_by": i.resolved_by,
            "resolved_at": i.resolved_at,
            "verdicts": [
                {
                    "verdict": f.verdict,
                    "comment": f.comment[:MAX_TEXT],
                    "by": f.created_by,
                    "at": f.created_at,
                }
                for f in self.verdicts[-MAX_VERDICTS:]
            ],
        }
        if self.url:
            out["url"] = self.url
        return out


class IncidentMemory:
    """The kept incidents (`IncidentStore`) and their index, for one process; thread-safe
    (the pipeline records while the HTTP port searches).

    `record` is what the alert pipeline calls when a group opens or changes; `similar`
    what it asks for a group's past lookalikes; `search` serves operators' text; `resolve`
    and `attach_verdict` keep what operators said. The index mirrors the store as this
    process writes it; an incident that another process deleted is skipped when found.
    """

    def __init__(
        self,
        path: str | Path,
        settings: IncidentMemorySettings | None = None,
        *,
        feedback_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or IncidentMemorySettings()
        self.clock = clock
        self.store = IncidentStore(path, self.settings.max_incidents, feedback_path)
        self.index = IncidentIndex()
        # `_writing` orders the store's writes and their index updates; `_lock` guards the index
        # alone, so a lookup never waits on a write that waits on the file's lock (the outbox
        # looks past incidents up inside its own write transaction)
        self._writing = threading.Lock()
        self._lock = threading.Lock()
        for incident in self.store.all():
            self.index.add(incident)

    def record(self, seen: Incident, embedding: Embedding | None = None) -> Incident:
        """Keep what an alert group says of its incident now (`store.observed(group,
        anomaly)`), with the anomaly's line embedding when the pipeline has one."""
        with self._writing:
            incident, evicted = self.store.record(seen, embedding)
            with self._lock:
                self.index.remove(evicted)
                if incident.fingerprint not in evicted:  # at the cap, the oldest may be the new one itself
                    self.index.add(incident)
        return incident

    def embedded(self, fingerprint: str, embedding: Embedding) -> Incident | None:
        """Average one more line's embedding into a kept incident (`IncidentStore.embedded`);
        None when the incident is gone."""
        with self._writing:
            incident = self.store.embedded(fingerprint, embedding)
            if incident is not None:
                with self._lock:
                    self.index.add(incident)
        return incident

    def similar(self, fingerprint: str, feedback: list[Feedback] | None = None) -> list[PastIncident]:
        """The incidents most like this kept one that began before it (its own group's
        earlier incidents included). `feedback`: the verdicts, when the caller read them
        for several lookups at once (else they are read here)."""
        incident = self.store.get(fingerprint)
        if incident is None:
            return []
        with self._lock:
            hits = self.index.nearest(
                incident_words(incident), incident.embedding, self.settings,
                stream=incident.streams[0] if incident.streams else None, before=incident.first_seen,
                exclude=fingerprint,
            )  # fmt: skip
        return self._found(hits, feedback)

    def search(self, text: Sequence[str], embedding: Embedding | None = None) -> list[PastIncident]:
        """The incidents most like some text (masked lines or templates), and its
        embedding when the caller has the model at hand."""
        with self._lock:
            hits = self.index.nearest(text_words(text), embedding, self.settings)
        return self._found(hits)

    def _found(
        self, hits: list[tuple[str, float, float, float]], feedback: list[Feedback] | None = None
    ) -> list[PastIncident]:
        out = []
        if feedback is None:
            feedback = self.store.verdicts() if hits else []  # read once per lookup
        now = self.clock()
        for fingerprint, score, template, similar in hits:
            incident = self.store.get(fingerprint)
            if incident is None:  # deleted by another process since
                continue
            verdicts = tuple(verdicts_on(incident, feedback, now))
            out.append(
                PastIncident(incident, score, template, similar, verdicts, self.settings.url(fingerprint))
            )
        return out

    def resolve(self, fingerprint: str, text: str, by: str = "") -> Incident:
        """Write what was done about an incident; later lookups carry it."""
        return self.store.resolve(fingerprint, text, by, self.clock())

    def attach_verdict(self, fingerprint: str, verdict: str, comment: str = "", by: str = "") -> Feedback:
        """`IncidentStore.attach_verdict`: a `logstream feedback` verdict by fingerprint."""
        return self.store.attach_verdict(fingerprint, verdict, comment, by)

    def prune(self) -> int:
        """Delete incidents not seen for `retention`; how many went."""
        with self._writing:
            gone = self.store.prune(self.clock() - self.settings.retention)
            with self._lock:
                self.index.remove(gone)
        return len(gone)

    def close(self) -> None:
        self.store.close()
