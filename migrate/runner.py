"""Process many files, in parallel worker processes when asked, with a progress bar on a terminal."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from tfmigrate.engine import Settings
from tfmigrate.processing import FileResult, process_file

Job = tuple[Path, str]  # (path on disk, display path)

# A task is a few files: enough to amortise the round trip to a worker, few enough that the
# last tasks are short and both workers finish together.
_TASK_FILES = 8
_TASKS_PER_WORKER = 24
# (generation 0 allocations, then collections of the younger generation) before each runs.
_GC_THRESHOLDS = (100_000, 50, 100)


def _process_chunk(chunk: list[Job], settings: Settings) -> list[FileResult]:
    return [process_file(path, display, settings) for path, display in chunk]


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def plan_tasks(jobs_list: Sequence[Job], workers: int) -> list[list[int]]:
    """Indices of ``jobs_list`` grouped into tasks, biggest files first: the costly files start
    at once instead of landing on one worker at the end, and the small ones fill the gaps."""
    order = sorted(range(len(jobs_list)), key=lambda i: -_size(jobs_list[i][0]))
    size = max(1, min(_TASK_FILES, len(order) // (workers * _TASKS_PER_WORKER)))
    tasks: list[list[int]] = []
    position = 0
    while position < len(order):
        # The first tasks (the biggest files) hold one file each; then ``size`` files per task.
        step = 1 if position < workers * 2 else size
        tasks.append(order[position : position + step])
        position += step
    return tasks


def run_files(
    jobs_list: Sequence[Job],
    settings: Settings,
    jobs: int = 1,
    on_done: Callable[[int], None] | None = None,
) -> list[FileResult]:
    """Results in input order. ``on_done(n)`` reports progress."""
    with _fewer_collections():
        return _run_files(jobs_list, settings, jobs, on_done)


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """A libcst tree is hundreds of thousands of small objects without reference cycles (freed
    by reference counting); at the default thresholds the cyclic collector scanned them over
    and over, a fifth of a scan's time. Start-up's objects (rules, libcst) are frozen out of it
    and it runs less often; the memory this costs stays well under the 300 MB target."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _run_files(
    jobs_list: Sequence[Job],
    settings: Settings,
    jobs: int,
    on_done: Callable[[int], None] | None,
) -> list[FileResult]:
    if jobs <= 1 or len(jobs_list) < 8:
        results = []
        for path, display in jobs_list:
            results.append(process_file(path, display, settings))
            if on_done:
                on_done(1)
        return results

    tasks = plan_tasks(jobs_list, jobs)
    # fork: workers start with everything imported (rules, libcst) instead of importing again.
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    ordered: list[FileResult | None] = [None] * len(jobs_list)
    # Forked workers share the parent's pages until written; the cyclic collector would write
    # to every object it scans (copying the rules and libcst into each worker): the objects
    # frozen above stay off it.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        pending = {
            pool.submit(_process_chunk, [jobs_list[i] for i in task], settings): task
            for task in tasks
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = pending.pop(future)
                for index, result in zip(task, future.result(), strict=True):
                    ordered[index] = result
                if on_done:
                    on_done(len(task))
    missing = [jobs_list[i][1] for i, result in enumerate(ordered) if result is None]
    if missing:
        raise RuntimeError(f"no result for {', '.join(missing)}")
    return cast("list[FileResult]", ordered)  # none is missing
