"""The emitted program undoes tf.data's malloc setting, which made every step page-fault its
large tensors in again (the migrated side's steps took about twice the CPU time at batch 256)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tfmigrate.rules import _tower_program_example as example

# In a fresh process: let tf.data make its setting (as any distributed dataset does), count the
# page faults of a 1 MB allocation, run the converted program's helper, count again.
PROBE = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    import tensorflow as tf

    def faults_per_allocation():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            np.ones(2**18, np.float32).sum()  # 1 MB: above 128 KB, below glibc's own ceiling
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20

    program = {}
    exec(compile(sys.stdin.read(), "converted.py", "exec"), program)
    dataset = tf.data.Dataset.range(4)
    for _ in tf.distribute.MirroredStrategy(["/cpu:0"]).experimental_distribute_dataset(dataset):
        pass
    faults_per_allocation()
    with_setting = faults_per_allocation()
    program["keep_large_tensors_on_the_heap"]()
    faults_per_allocation()
    print(json.dumps({"with_setting": with_setting, "after": faults_per_allocation()}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_converted_program_keeps_large_tensors_on_the_heap() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=example.CONVERTED,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    if faults["with_setting"] < 100:
        pytest.skip(f"this TensorFlow no longer lowers the mmap threshold ({faults})")
    # 1 MB is 256 pages: each allocation was mapped afresh; now it comes from the heap
    assert faults["after"] < 10, faults
