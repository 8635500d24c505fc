"""The canonical tensor encoding: what every SHA-256 of a tensor hashes (a fixture's id, each output's hash).

    ascii(dtype.str) + b"|" + ascii(",".join(shape)) + b"|" + C-order little-endian bytes

where dtype.str is numpy's little-endian type string ("<f4", "|u1", "<i8", ...) and a 0-d tensor has an
empty shape string. Two hosts compare only when they were fed the same tensor, so the fixtures (which name
a fixture by it) and the worker (which checks its inputs and hashes its outputs by it) share this one module.

It travels with the worker (quantbench/worker/) to every host, so it needs only the standard library and numpy
and imports nothing of quantbench: a worker started by path loads this file beside its package, and one sent
as source (ssh) receives it first (hosts.process.worker_source).
"""

from __future__ import annotations

import hashlib

import numpy as np


def canonical(arr: "np.ndarray") -> "np.ndarray":
    """The array as C-contiguous little-endian (the byte order every host hashes)."""
    arr = np.asarray(arr)
    # astype keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d)
    return arr.astype(arr.dtype.newbyteorder("<"), order="C", copy=False)


def tensor_header(arr: "np.ndarray") -> bytes:
    arr = canonical(arr)
    return arr.dtype.str.encode("ascii") + b"|" + ",".join(str(int(d)) for d in arr.shape).encode("ascii") + b"|"


def tensor_sha256(arr: "np.ndarray") -> str:
    """SHA-256 of the canonical encoding (dtype, shape, C-order little-endian bytes)."""
    arr = canonical(arr)
    h = hashlib.sha256(tensor_header(arr))
    h.update(memoryview(arr).cast("B") if arr.size else b"")
    return h.hexdigest()


def tensor_bytes(arr: "np.ndarray") -> bytes:
    """Raw C-order little-endian bytes of the canonical encoding (no header)."""
    return canonical(arr).tobytes()


def tensor_from_bytes(data, dtype: str, shape) -> "np.ndarray":
    """Inverse of tensor_bytes: a (read-only) array of `dtype` and `shape` over `data`."""
    dt = np.dtype(dtype)
    arr = np.frombuffer(data, dtype=dt) if len(data) else np.zeros(0, dtype=dt)
    return arr.reshape([int(d) for d in shape])
