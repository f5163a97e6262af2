"""Input fingerprints that do not care how a batch was split over devices.

Both sides describe a training step's input as *streams*: one per input array (images, labels, ...).
A stream is the ordered sequence of its rows (samples along axis 0), so tower 0's slice followed by
tower 1's slice fingerprints the same as the global batch a replica-splitting dataset started from.
The step fingerprint is the sorted list of stream digests, so names and feed order do not matter.
numpy only: imported by both boot modules and by the comparison.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np


def canonical(array: object) -> np.ndarray:
    """Normalise dtypes the two sides may legitimately differ in (float64 fed into float32, int32 vs int64)."""
    a = np.asarray(array)
    if a.dtype.kind == "f":
        a = a.astype(np.float32)
    elif a.dtype.kind in "iu":
        a = a.astype(np.int64)
    elif a.dtype.kind == "b":
        a = a.astype(np.bool_)
    return np.ascontiguousarray(a)


def is_data(array: object) -> bool:
    """Arrays with a batch axis are data; scalar feeds (learning rate, keep_prob, a flag) are not."""
    a = np.asarray(array)
    return a.ndim >= 1 and a.dtype.kind in "fiub"


def stream_digest(parts: Sequence[object]) -> str:
    """Digest of the rows of ``parts`` concatenated along axis 0 (the slices in tower/replica order)."""
    arrays = [canonical(part) for part in parts]
    a = (
        arrays[0]
        if len(arrays) == 1
        else np.concatenate([x.reshape((-1,) + x.shape[1:]) for x in arrays])
    )
    h = hashlib.sha1()
    h.update(a.dtype.str.encode())
    h.update(repr(a.shape).encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]


def step_fingerprint(streams: Iterable[Sequence[object]]) -> list[str]:
    return sorted(stream_digest(parts) for parts in streams)


def step_samples(streams: Iterable[Sequence[object]]) -> int | None:
    """Samples in the step (rows of its longest stream): names a global/per-replica batch mix-up."""
    rows = [sum(int(np.asarray(p).shape[0]) for p in parts) for parts in streams
            if parts and all(np.asarray(p).ndim >= 1 for p in parts)]
    return max(rows) if rows else None
