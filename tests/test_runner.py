"""Parallel runs hand out the biggest files first, in small tasks, and still return every result
in input order, identical to a serial run."""

from __future__ import annotations

from pathlib import Path

from tfmigrate.engine import Settings
from tfmigrate.registry import select_rules
from tfmigrate.runner import plan_tasks, run_files

TOWER = """import tensorflow as tf
grads = []
for i in range(2):
    with tf.device('/gpu:%d' % i):
        grads.append(i)
config = tf.ConfigProto(allow_soft_placement=True)
"""


def _tree(root: Path, count: int) -> list[tuple[Path, str]]:
    jobs = []
    for index in range(count):
        path = root / f"m{index:02d}.py"
        # Sizes vary and do not follow the names, so input order != size order.
        body = TOWER if index % 3 == 0 else "import os\n"
        path.write_text(body + "x = 1\n" * ((index * 7) % 11), encoding="utf-8")
        jobs.append((path, path.name))
    return jobs


def test_plan_covers_every_file_once_biggest_first(tmp_path):
    jobs = _tree(tmp_path, 60)
    tasks = plan_tasks(jobs, workers=2)
    flat = [index for task in tasks for index in task]
    assert sorted(flat) == list(range(len(jobs)))
    sizes = [jobs[index][0].stat().st_size for index in flat]
    assert sizes == sorted(sizes, reverse=True)
    assert all(len(task) == 1 for task in tasks[:4])  # the costly files go out one by one
    assert len(tasks) > 4 * 2  # enough tasks that neither worker waits at the end


def test_parallel_results_are_in_input_order_and_equal_to_serial(tmp_path):
    jobs = _tree(tmp_path, 24)
    settings = Settings(rules=select_rules())
    progress: list[int] = []
    serial = run_files(jobs, settings, jobs=1)
    parallel = run_files(jobs, settings, jobs=2, on_done=progress.append)
    assert [r.path for r in parallel] == [display for _, display in jobs]
    assert [(r.path, [f.to_json() for f in r.findings], r.error) for r in parallel] == [
        (r.path, [f.to_json() for f in r.findings], r.error) for r in serial
    ]
    assert any(r.findings for r in parallel)
    assert sum(progress) == len(jobs)
