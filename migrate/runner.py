"""Process many files, in parallel worker processes when asked, with a progress bar on a terminal."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tfmigrate.engine import Settings
from tfmigrate.processing import FileResult, process_file

Job = tuple[Path, str]  # (path on disk, display path)


def _process_chunk(chunk: list[Job], settings: Settings) -> list[FileResult]:
    return [process_file(path, display, settings) for path, display in chunk]


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def run_files(
    jobs_list: Sequence[Job],
    settings: Settings,
    jobs: int = 1,
    on_done: Callable[[int], None] | None = None,
) -> list[FileResult]:
    """Results in input order. ``on_done(n)`` reports progress."""
    if jobs <= 1 or len(jobs_list) < 8:
        results = []
        for path, display in jobs_list:
            results.append(process_file(path, display, settings))
            if on_done:
                on_done(1)
        return results

    # Chunks amortise pickling; small enough to keep both workers busy to the end.
    size = max(1, min(64, len(jobs_list) // (jobs * 8)))
    chunks = [list(jobs_list[i : i + size]) for i in range(0, len(jobs_list), size)]
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    ordered: list[list[FileResult] | None] = [None] * len(chunks)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {
            pool.submit(_process_chunk, chunk, settings): i for i, chunk in enumerate(chunks)
        }
        from concurrent.futures import as_completed

        for future in as_completed(futures):
            index = futures[future]
            ordered[index] = future.result()
            if on_done:
                on_done(len(chunks[index]))
    return [result for chunk in ordered for result in (chunk or [])]
