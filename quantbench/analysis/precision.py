"""Numeric distance between two output tensors: |delta| and remaining precision bits.

Remaining precision (Schlögl et al.) is the number of leading identical mantissa
bits of two IEEE binary32 values: 23 when the values are identical, fewer as
they drift apart. The published reference implementation returns the number of
*differing low* bits instead (``23 - ours``); we report identical bits, so more
is better and 23 means byte-equal.

Edge cases, chosen so that the metric never claims agreement it cannot show:
  * identical bit patterns -> 23; +0.0 and -0.0 -> 23 (they compare equal);
  * both NaN (any payload) -> 23; exactly one NaN -> 0;
  * different sign or different exponent (which covers inf against finite and
    values straddling a power of two) -> 0: the mantissas are then not
    comparable bit by bit, and a value that crossed a binade has lost at least
    its leading bit of agreement.
Only float32 tensors have remaining bits; other dtypes report None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MANTISSA_BITS = 23
_SIGN = np.uint32(0x80000000)
_EXP = np.uint32(0x7F800000)
_MANT = np.uint32(0x007FFFFF)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative integers below 2**24 (exact via float64 frexp)."""
    _, e = np.frexp(x.astype(np.float64))
    return np.where(x == 0, 0, e).astype(np.int64)


def remaining_bits(a, b) -> np.ndarray:
    """Leading identical mantissa bits of float32 `a` against `b`, element-wise (int64, 0..23)."""
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    b = np.ascontiguousarray(np.asarray(b, dtype=np.float32))
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    ua = a.view(np.uint32)
    ub = b.view(np.uint32)
    diff_mant = (ua ^ ub) & _MANT
    bits = MANTISSA_BITS - _bit_length(diff_mant)
    same_sign_exp = ((ua ^ ub) & (_SIGN | _EXP)) == 0
    bits = np.where(same_sign_exp, bits, 0)
    na, nb = np.isnan(a), np.isnan(b)
    both_zero = (a == 0) & (b == 0)
    bits = np.where(both_zero | (na & nb), MANTISSA_BITS, bits)
    bits = np.where(na ^ nb, 0, bits)
    return bits.astype(np.int64)


@dataclass
class Distance:
    """Distance of one output between two hosts/variants, over all compared elements."""

    elements: int
    differing: int             # elements whose bit patterns differ
    max_abs: float             # max |delta| over elements where both are finite
    mean_abs: float            # mean |delta| over the same elements
    nan_mismatch: int          # elements NaN on exactly one side
    bits_mean: float | None    # remaining precision bits, mean (float32 only)
    bits_min: int | None       # remaining precision bits, minimum (float32 only)

    def as_dict(self) -> dict:
        return asdict(self)


def distance(a, b) -> Distance:
    """|delta| statistics and remaining precision of `b` against `a` (same shape and dtype)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch: {a.dtype} vs {b.dtype}")
    n = int(a.size)
    if a.dtype.kind == "f":
        differing = int(np.count_nonzero(a.view(f"u{a.itemsize}") != b.view(f"u{b.itemsize}"))) if n else 0
    else:
        differing = int(np.count_nonzero(a != b))
    fa = a.astype(np.float64)
    fb = b.astype(np.float64)
    na, nb = np.isnan(fa), np.isnan(fb)
    finite = np.isfinite(fa) & np.isfinite(fb)
    d = np.abs(fa[finite] - fb[finite])
    bits_mean = bits_min = None
    if a.dtype == np.float32 and n:
        rb = remaining_bits(a, b)
        bits_mean = float(rb.mean())
        bits_min = int(rb.min())
    return Distance(
        elements=n,
        differing=differing,
        max_abs=float(d.max()) if d.size else 0.0,
        mean_abs=float(d.mean()) if d.size else 0.0,
        nan_mismatch=int(np.count_nonzero(na ^ nb)),
        bits_mean=bits_mean,
        bits_min=bits_min,
    )


class DistanceAccumulator:
    """Combines per-fixture distances of one output into one (exact max/min, weighted mean)."""

    def __init__(self) -> None:
        self.elements = self.differing = self.nan_mismatch = 0
        self.max_abs = 0.0
        self._sum_abs = 0.0
        self._n_abs = 0
        self._bits_sum = 0.0
        self._bits_n = 0
        self.bits_min: int | None = None

    def add(self, a, b) -> None:
        dist = distance(a, b)
        fa = np.asarray(a, dtype=np.float64)
        fb = np.asarray(b, dtype=np.float64)
        n_fin = int(np.count_nonzero(np.isfinite(fa) & np.isfinite(fb)))
        self.elements += dist.elements
        self.differing += dist.differing
        self.nan_mismatch += dist.nan_mismatch
        self.max_abs = max(self.max_abs, dist.max_abs)
        self._sum_abs += dist.mean_abs * n_fin
        self._n_abs += n_fin
        if dist.bits_mean is not None:
            self._bits_sum += dist.bits_mean * dist.elements
            self._bits_n += dist.elements
            self.bits_min = dist.bits_min if self.bits_min is None else min(self.bits_min, dist.bits_min)

    def result(self) -> Distance:
        return Distance(
            elements=self.elements,
            differing=self.differing,
            max_abs=self.max_abs,
            mean_abs=self._sum_abs / self._n_abs if self._n_abs else 0.0,
            nan_mismatch=self.nan_mismatch,
            bits_mean=self._bits_sum / self._bits_n if self._bits_n else None,
            bits_min=self.bits_min,
        )
