"""What the whole-program conversion leaves to the user: ``# TODO(tfmigrate): TFM3xx`` markers,
one code per kind of leftover, each with the reason the converter could not do it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Leftover(Enum):
    """The TODO codes of a partial conversion (docs/conversion.md lists them)."""

    SESSION = ("TFM310", "runs the TF1 session")
    INPUT = ("TFM311", "input pipeline with no TF2 form here")
    CHECKPOINT = ("TFM312", "checkpointing through tf.train.Saver")
    SUMMARY = ("TFM313", "TF1 summaries")
    CASCADE = ("TFM314", "uses a name defined under a TODO")
    TOWER_VALUE = ("TFM315", "reads a tower's value outside the replicas")
    PER_REPLICA = ("TFM316", "runs per replica where the legacy ran it once")
    GRAPH = ("TFM317", "TF1 graph API with no TF2 form")
    UNDEFINED = ("TFM318", "reads a name the program never defines")

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def title(self) -> str:
        return self.value[1]


@dataclass(frozen=True)
class Todo:
    """One statement left to the user: kept live (``commented=False``) or commented out because
    it would break the TF2 program at run time."""

    kind: Leftover
    why: str
    commented: bool = True

    @property
    def unsafe(self) -> bool:
        """Whether it makes the fix unsafe: code commented out, code kept live that does not
        work in TF2 (a queue input), or what ran once changed into per replica (clipping the
        combined gradients)."""
        return self.commented or self.kind in (Leftover.INPUT, Leftover.PER_REPLICA)

    def marker(self) -> str:
        return f"# TODO(tfmigrate): {self.kind.code} {self.why}"
