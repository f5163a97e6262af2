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


class CountingSteps:
    """Stands in for verify's traced loop: records how many steps each call was asked for."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def __call__(self, iterator, count: int) -> list[dict]:
        self.counts.append(count)
        steps = []
        for _ in range(count):
            batch = next(iterator, None)
            if batch is None:
                break
            steps.append(
                {
                    "outputs": {"loss": [np.float32(1.0)]},
                    "per_replica": [],
                    "watched": [],
                    "inputs": [list(batch[0].parts)],
                }
            )
        return steps


def run_one_step_program(tmp_path: Path, extra: dict) -> list[int]:
    loop = CountingSteps()

    class Runner(MigratedRunner):
        def watched_steps(self, watch):
            return loop

    def one_step(batch):
        raise AssertionError("verify's loop runs one_step, not this test")

    program = {
        "variables": {},
        "train_step": train_step,
        "batches": Batches(7),
        "one_step": one_step,
    }
    runner = Runner(FAKE_TF, FAKE_STRATEGY, {**program, **extra}, tmp_path)
    runner.run(7, [])
    assert [s.step for s in runner.record.steps] == list(range(1, 8))
    return loop.counts


class Batches:
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __iter__(self):
        for step in range(self.steps):
            x = np.full((4, 3), step, dtype=np.float32)
            yield (FakeDistributed([x[:2], x[2:]]),)


def test_verify_runs_as_many_steps_per_call_as_the_programs_own_loop(tmp_path: Path):
    # by default several steps to a call (after a first call of two: both call sites trace)
    assert run_one_step_program(tmp_path, {}) == [2, 5]
    # a program whose loop runs one step per call (fit without steps_per_execution) says so
    assert run_one_step_program(tmp_path, {"steps_per_call": 1}) == [2, 1, 1, 1, 1, 1]
    assert run_one_step_program(tmp_path, {"steps_per_call": 3}) == [2, 3, 2]
