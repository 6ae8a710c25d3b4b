"""Online template mining (Drain, via the drain3 library) and the pattern prompt.

Templates serve three ends: grouping alerts (one incident, one template), the
*pattern prompt* (the stream's most common templates, whose K/V become the attention
sinks), and novelty (a line whose template the model has never seen). Lines arrive
already masked by `normalize`, so drain3's own masking is off.

Drain's similarity (the share of a template's tokens a line repeats) counts the masked
header fields every line of a format shares (`<TS> <HOST>`) as one token, however many the
format writes: they say when and where, not what. Counted one by one, BlueGene/L's five
made `RAS KERNEL FATAL rts panic! - stopping execution` join `RAS KERNEL INFO instruction
cache parity error corrected` (7 of 13 tokens equal); loghub's parsers cut the header first.

A template's id is a hash of its text, not drain3's per-process counter: the same
template has the same id in every process and after every restart, so alert groups and
fingerprints stay stable. The miner keeps at most `max_templates` (least recently used
are forgotten), so hostile or unbounded input cannot grow it without limit.

A log repeats most of its masked lines, and Drain's search for a line depends only on the
prefix tree and the templates, not on the clusters' sizes. So a line that matched a cluster
without changing it matches it again while no cluster is created and no template changes:
the miner keeps such lines (`CACHED_LINES`) and forgets them all at the next change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from drain3 import TemplateMiner
from drain3.drain import LogCluster
from drain3.template_miner_config import TemplateMinerConfig


@dataclass(frozen=True)
class Template:
    id: int
    text: str
    count: int


MAX_TEMPLATES = 10_000
CACHED_LINES = 8192  # masked lines whose match a miner keeps (emptied when full, and at every change)


@lru_cache(maxsize=MAX_TEMPLATES)  # every line asks for its template's id; templates are few
def template_id(text: str) -> int:
    """A stable 48-bit id of a template's text (the same in every process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:6], "big")


@dataclass(frozen=True)
class Mined:
    template_id: int
    template: str
    new: bool  # the line opened a new template
    cluster: int  # drain3's cluster number: 1..n for the n templates a miner was seeded with


EXTRA_DELIMITERS = ("|",)  # pipe-separated formats (HealthApp) are fields too


def split_tokens(text: str) -> list[str]:
    """A masked line's or a template's tokens as the miner splits them (drain3's
    `get_content_as_tokens`): at whitespace and at the extra delimiters. Whatever matches
    templates against lines splits this way, or a pipe-separated line is one long token."""
    for delimiter in EXTRA_DELIMITERS:
        text = text.replace(delimiter, " ")
    return text.split()


def _miner_config(similarity: float, depth: int, max_templates: int) -> TemplateMinerConfig:
    config = TemplateMinerConfig()
    config.drain_max_clusters = max_templates
    config.drain_sim_th = similarity
    config.drain_depth = depth
    config.masking_instructions = []  # normalize.py already masked variables
    config.drain_extra_delimiters = list(EXTRA_DELIMITERS)
    config.profiling_enabled = False
    config.parametrize_numeric_tokens = False
    return config


def header_as_one_similarity(seq1: list[str], seq2: list[str], include_params: bool) -> tuple[float, int]:
    """drain3's `Drain.get_seq_distance` (template `seq1`, line `seq2`, equal lengths: the
    share of equal tokens, wildcards equal with `include_params`; and the template's
    wildcards), with the masked fields both open with (`<TS>`, `<HOST>`; not the wildcard
    `<*>`) counted as one equal token. It runs for every candidate template of every line:
    indexes, not slices."""
    header = 0
    # equal lengths, and it stops at the header's end; zip's keyword argument costs 5 µs a line
    for t1, t2 in zip(seq1, seq2):  # noqa: B905
        if t1 != t2 or t1[:1] != "<" or t1[-1:] != ">" or not t1[1:-1].isupper():
            break
        header += 1
    params = equal = 0
    for i in range(header, len(seq1)):
        token = seq1[i]
        if token == "<*>":
            params += 1
        elif token == seq2[i]:
            equal += 1
    shared = header > 0  # the header: one equal token
    counted = len(seq1) - header + shared
    if not counted:  # empty sequences: drain3 calls them a full match
        return 1.0, 0
    return (equal + shared + params * include_params) / counted, params


class PatternMiner:
    """Streaming Drain: `add` assigns a template id to each masked line."""

    def __init__(self, similarity: float = 0.5, depth: int = 4, max_templates: int = MAX_TEMPLATES) -> None:
        self._miner = TemplateMiner(config=_miner_config(similarity, depth, max_templates))
        self._miner.drain.get_seq_distance = header_as_one_similarity
        self._unchanged: dict[str, tuple[LogCluster, Mined]] = {}  # lines whose match changed nothing

    def add(self, masked_line: str) -> Mined:
        drain = self._miner.drain
        if (known := self._unchanged.get(masked_line)) is not None:
            cluster, mined = known
            cluster.size += 1  # what Drain does for a match that leaves the template as it is
            drain.id_to_cluster[cluster.cluster_id]  # touches it in the LRU, as Drain does
            return mined
        # drain3's Drain itself: TemplateMiner.add_log_message adds only its masking, profiling
        # and persistence, all off here, and a result dict per line
        cluster, change = drain.add_log_message(masked_line)
        text = cluster.get_template()
        mined = Mined(template_id(text), text, new=change == "cluster_created", cluster=cluster.cluster_id)
        if change != "none":
            self._unchanged.clear()  # a new cluster or template can win another line's search
            return mined
        if len(self._unchanged) >= CACHED_LINES:
            self._unchanged.clear()
        self._unchanged[masked_line] = (cluster, mined)
        return mined

    def match(self, masked_line: str) -> int | None:
        """Template id of the closest known template, without learning; None if new."""
        cluster = self._miner.match(masked_line)
        return None if cluster is None else template_id(cluster.get_template())

    @property
    def size(self) -> int:
        return len(self._miner.drain.clusters)

    def cluster_ids(self) -> set[int]:
        """The clusters the miner holds (it evicts the least recently seen past max_templates)."""
        return {c.cluster_id for c in self._miner.drain.clusters}

    def templates(self) -> list[Template]:
        """All templates, most frequent first."""
        clusters = sorted(self._miner.drain.clusters, key=lambda c: (-c.size, c.cluster_id))
        return [Template(template_id(c.get_template()), c.get_template(), int(c.size)) for c in clusters]


def seeded_miner(templates: Iterable[str]) -> tuple[PatternMiner, list[int]]:
    """A miner that already knows `templates` (the model's training templates), so only
    templates the model has never seen count as new; and the cluster each template seeded.
    Seeding is deterministic: the known templates are clusters 1..size in every process,
    whatever their text becomes later."""
    miner = PatternMiner()
    return miner, [miner.add(text).cluster for text in templates]


def mine(masked_lines: Iterable[str], similarity: float = 0.5) -> PatternMiner:
    miner = PatternMiner(similarity=similarity)
    for line in masked_lines:
        miner.add(line)
    return miner


def pattern_prompt(templates: list[Template], max_templates: int = 16) -> list[str]:
    """The most common templates, one per line: the text whose K/V become the sinks."""
    return [t.text for t in templates[:max_templates]]
