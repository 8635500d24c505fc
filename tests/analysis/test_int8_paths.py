"""Which U8S8 int8 path a host takes, from its fingerprint's ISA flags (the MLAS dispatch, analysis/tiers.py):
AVX2 and AVX-512BW without VNNI saturate (VPMADDUBSW); AVX-512 VNNI, AVX-VNNI and AMX accumulate exactly, so
does the SSE kernel; NEON-only ARM wraps int16 pair sums; dot product and i8mm are exact."""

import pytest

from quantbench.analysis.tiers import int8_path

SSE = ["sse2", "sse4_1", "sse4_2"]
AVX2 = SSE + ["avx", "avx2", "fma"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512dq", "avx512vl"]


@pytest.mark.parametrize("flags,kind,named", [
    (SSE, "exact", "no avx2"),                                               # Nehalem
    (AVX2, "saturates", "avx2 without"),                                     # Haswell, Zen 2
    (AVX512, "saturates", "avx512bw without"),                               # Skylake-SP
    (AVX512 + ["avx512_vnni"], "exact", "avx512_vnni"),                      # Cascade Lake, Zen 4
    (AVX2 + ["avx_vnni"], "exact", "avx_vnni"),                              # Alder Lake
    (AVX512 + ["avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"], "exact", "amx_int8"),   # Sapphire Rapids
    (AVX512 + ["avx512vnni", "fma3"], "exact", "avx512_vnni"),               # numpy's names, as older fingerprints
])
def test_x86_tiers(flags, kind, named):
    p = int8_path("h", "x86_64", flags)
    assert p.kind == kind and named in p.why


@pytest.mark.parametrize("flags,kind", [(["asimd"], "wraps"), (["asimd", "asimddp"], "exact"),
                                        (["asimd", "asimddp", "i8mm", "sve", "bf16"], "exact")])
def test_arm_tiers(flags, kind):
    assert int8_path("h", "aarch64", flags).kind == kind
