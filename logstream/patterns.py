"""Online template mining (Drain, via the drain3 library) and the pattern prompt.

Templates serve two ends: grouping alerts (one incident, one template) and the
*pattern prompt*, the stream's most common templates, whose K/V become the
attention sinks. Lines arrive already masked by `normalize`, so drain3's own
masking is off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig


@dataclass(frozen=True)
class Template:
    id: int
    text: str
    count: int


def _miner_config(similarity: float, depth: int) -> TemplateMinerConfig:
    config = TemplateMinerConfig()
    config.drain_sim_th = similarity
    config.drain_depth = depth
    config.masking_instructions = []  # normalize.py already masked variables
    config.drain_extra_delimiters = ["|"]  # pipe-separated formats (HealthApp) are fields too
    config.profiling_enabled = False
    config.parametrize_numeric_tokens = False
    return config


class PatternMiner:
    """Streaming Drain: `add` assigns a template id to each masked line."""

    def __init__(self, similarity: float = 0.5, depth: int = 4) -> None:
        self._miner = TemplateMiner(config=_miner_config(similarity, depth))

    def add(self, masked_line: str) -> int:
        return int(self._miner.add_log_message(masked_line)["cluster_id"])

    def match(self, masked_line: str) -> int | None:
        """Template id of the closest known template, without learning; None if new."""
        cluster = self._miner.match(masked_line)
        return None if cluster is None else int(cluster.cluster_id)

    def template(self, template_id: int) -> str:
        return self._miner.drain.id_to_cluster[template_id].get_template()

    def templates(self) -> list[Template]:
        """All templates, most frequent first."""
        clusters = sorted(self._miner.drain.clusters, key=lambda c: (-c.size, c.cluster_id))
        return [Template(int(c.cluster_id), c.get_template(), int(c.size)) for c in clusters]


def mine(masked_lines: Iterable[str], similarity: float = 0.5) -> PatternMiner:
    miner = PatternMiner(similarity=similarity)
    for line in masked_lines:
        miner.add(line)
    return miner


def pattern_prompt(templates: list[Template], max_templates: int = 16) -> list[str]:
    """The most common templates, one per line: the text whose K/V become the sinks."""
    return [t.text for t in templates[:max_templates]]
