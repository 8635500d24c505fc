"""The worker: runs on every host, needs only the standard library, numpy and onnxruntime.

This file must stay self-contained (no quantbench imports, Python 3.9+), because it
travels as source to bare hosts (an emulated arm64 root, a Raspberry Pi over ssh).
onnxruntime is imported lazily so the rest of quantbench can import the canonical
tensor hash from here without loading onnxruntime.

Canonical tensor encoding (the input to every SHA-256 of a tensor):
    ascii(dtype.str) + b"|" + ascii(",".join(shape)) + b"|" + C-order little-endian bytes
where dtype.str is numpy's little-endian type string ("<f4", "|u1", "<i8", ...) and
a 0-d tensor has an empty shape string.
"""

from __future__ import annotations

import hashlib

import numpy as np


def canonical(arr: "np.ndarray") -> "np.ndarray":
    """The array as C-contiguous little-endian (the byte order every host hashes)."""
    arr = np.asarray(arr)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))


def tensor_header(arr: "np.ndarray") -> bytes:
    arr = canonical(arr)
    return arr.dtype.str.encode("ascii") + b"|" + ",".join(str(int(d)) for d in arr.shape).encode("ascii") + b"|"


def tensor_sha256(arr: "np.ndarray") -> str:
    """SHA-256 of the canonical encoding (dtype, shape, C-order little-endian bytes)."""
    arr = canonical(arr)
    h = hashlib.sha256(tensor_header(arr))
    h.update(memoryview(arr).cast("B") if arr.size else b"")
    return h.hexdigest()
