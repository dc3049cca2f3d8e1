"""A training stage's result as a process of its own saves it and the calling process
loads it back (tasks/launch.py: `python -m tasks.launch SPEC`, under `accelerate launch`
or alone): rank 0 writes `<name>-result.json`, one flat JSON object of the result's
fields (grpo_core.train.grpo.RoundResult, grpo_core.train.sft.SFTResult) and the
process's own (`RankInfo`); the caller reads back the same types, never a dict."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TypeVar

from grpo_core.findings import Finding

T = TypeVar("T")


@dataclasses.dataclass
class RankInfo:
    """Rank 0's process: its pid, the world it trained in, its peak GPU memory, and what
    its step logger noted (tasks.tracking.step_logger: a finding for the stage)."""

    pid: int | None = None
    world_size: int = 1
    gpu_peak_gb: float | None = None
    notes: list[Finding] = dataclasses.field(default_factory=list)

    def __post_init__(self):  # read back from JSON
        self.notes = [Finding.of(f) for f in self.notes]


@dataclasses.dataclass
class ShardDone:
    """A filter or eval shard's process: the Parquet file it wrote."""

    path: str
    pid: int | None = None
    gpu_peak_gb: float | None = None


def save(path: str | Path, *parts) -> None:
    """The dataclasses `parts` as one flat JSON object at `path`."""
    doc: dict = {}
    for part in parts:
        doc.update(dataclasses.asdict(part))
    Path(path).write_text(json.dumps(doc, default=str))


def load(path: str | Path, cls: type[T]) -> T:
    """The `cls` fields of what `save` wrote at `path` (other fields are another part's)."""
    doc = json.loads(Path(path).read_text())
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in names})
