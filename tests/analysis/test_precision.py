"""Remaining precision bits and |delta| statistics on hand-made IEEE binary32 bit patterns."""

import numpy as np
import pytest

from quantbench.analysis.precision import MANTISSA_BITS, DistanceAccumulator, distance, remaining_bits


def f32(*bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_identical_values_have_23_bits():
    a = f32(0x3F800000, 0x40490FDB, 0x00000001, 0x7F7FFFFF)
    assert remaining_bits(a, a.copy()).tolist() == [23, 23, 23, 23]


@pytest.mark.parametrize("a_bits,b_bits,expected", [
    (0x3F800000, 0x3F800001, 22),   # last mantissa bit differs
    (0x3F800000, 0x3F800003, 21),   # two low bits differ -> highest differing is bit 1
    (0x3F800000, 0x3FC00000, 0),    # top mantissa bit (bit 22) differs
    (0x3F800000, 0x3F900000, 2),    # bit 20 differs: bits 22 and 21 identical
    (0x3F8000FF, 0x3F800000, 15),   # bits 0..7 differ
    (0x3F800000, 0x40000000, 0),    # exponent differs (1.0 vs 2.0)
    (0x3F800000, 0xBF800000, 0),    # sign differs
    (0x00000000, 0x80000000, 23),   # +0 vs -0 compare equal
    (0x7FC00000, 0x7FC00001, 23),   # both NaN (different payloads)
    (0x7FC00000, 0x3F800000, 0),    # NaN on one side only
    (0x7F800000, 0x7F7FFFFF, 0),    # inf vs largest finite: exponent differs
    (0x00000001, 0x00000003, 21),   # subnormals: bit 1 differs
])
def test_bit_patterns(a_bits, b_bits, expected):
    got = remaining_bits(f32(a_bits), f32(b_bits))
    assert got.tolist() == [expected]
    # symmetric
    assert remaining_bits(f32(b_bits), f32(a_bits)).tolist() == [expected]


def test_reference_convention_is_23_minus_ours():
    a = f32(0x3F800000, 0x3F800000, 0x3F800000)
    b = f32(0x3F800000, 0x3F800001, 0x3FC00000)
    assert (MANTISSA_BITS - remaining_bits(a, b)).tolist() == [0, 1, 23]   # the reference's convention


def test_distance_stats():
    a = np.array([1.0, 2.0, 3.0, np.nan], dtype=np.float32)
    b = np.array([1.0, 2.5, 2.0, 4.0], dtype=np.float32)
    d = distance(a, b)
    assert d.elements == 4 and d.differing == 3 and d.nan_mismatch == 1
    assert d.max_abs == 1.0 and d.mean_abs == pytest.approx(0.5)
    assert d.bits_min == 0
    # 1.0==1.0 -> 23; 2 vs 2.5: 0x40000000 vs 0x40200000 -> bit 21 differs -> 1; 3 vs 2: same exp,
    # 0x40400000 vs 0x40000000 -> bit 22 -> 0; NaN vs 4 -> 0
    assert d.bits_mean == pytest.approx((23 + 1 + 0 + 0) / 4)


def test_non_float32_has_no_bits_and_accumulator_combines():
    d = distance(np.array([1, 2, 3], np.int64), np.array([1, 2, 5], np.int64))
    assert d.bits_mean is None and d.max_abs == 2 and d.differing == 1
    acc = DistanceAccumulator()
    acc.add(np.float32([1, 1]), np.float32([1, 1]))
    acc.add(np.float32([1, 1]), f32(0x3F800000, 0x3F800001))
    r = acc.result()
    assert r.elements == 4 and r.differing == 1 and r.bits_min == 22
    assert r.bits_mean == pytest.approx((23 * 3 + 22) / 4)
    assert r.mean_abs == pytest.approx(float(f32(0x3F800001)[0] - 1.0) / 4)
