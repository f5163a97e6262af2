"""What verify's migrated runner times per step (no TensorFlow: a stand-in strategy and tf)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tfmigrate.verify.migrated_boot import MigratedRunner

NEXT_SECONDS = 0.05  # a slow input pipeline: taking a batch costs this much
STEP_SECONDS = 0.02  # the train step itself


class FakeDistributed:
    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts


FAKE_TF = SimpleNamespace(
    distribute=SimpleNamespace(DistributedValues=FakeDistributed),
    nest=SimpleNamespace(flatten=lambda x: list(x) if isinstance(x, tuple) else [x]),
)
FAKE_STRATEGY = SimpleNamespace(
    num_replicas_in_sync=2, experimental_local_results=lambda value: value.parts
)


class SlowBatches:
    """Distributed batches whose next() takes NEXT_SECONDS, like a pipeline that is not ready."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __iter__(self):
        for step in range(self.steps):
            time.sleep(NEXT_SECONDS)
            x = np.full((4, 3), step, dtype=np.float32)
            yield (FakeDistributed([x[:2], x[2:]]),)


def train_step(batch: tuple[FakeDistributed]) -> dict[str, FakeDistributed]:
    time.sleep(STEP_SECONDS)
    loss = [np.float32(p.sum()) for p in batch[0].parts]
    return {"loss": FakeDistributed(loss)}


def test_a_step_is_timed_from_taking_its_batch_until_its_fetches_are_on_the_host(tmp_path: Path):
    program = {"variables": {}, "train_step": train_step, "batches": SlowBatches(3)}
    runner = MigratedRunner(FAKE_TF, FAKE_STRATEGY, program, tmp_path)
    runner.run(3, [])
    assert [s.step for s in runner.record.steps] == [1, 2, 3]
    for step in runner.record.steps:
        # the legacy Session.run feeds its batch inside the timed call: so does the migrated side
        assert step.seconds >= NEXT_SECONDS + STEP_SECONDS
        assert [f.name for f in step.fetches] == ["loss[0]", "loss[1]"]
        assert step.samples == 4  # the batch is still fingerprinted, after the timed part
    assert runner.record.steps[1].inputs != runner.record.steps[0].inputs
