"""Kernel evidence: the A64 decoder on known instruction words (LLVM MC test vectors),
the log scanner on qemu-format lines, and a real emulated run of the demo classifier
on `pi` (Cortex-A76: dot product) against `pi4` (Cortex-A72: plain NEON)."""

import pytest

from quantbench.explain.evidence import decode_arm64, scan_log, x86_family
from setup_required import missing_setup


def emulated_host(name: str):
    """The host object of a built-in emulated host (registry.make_host)."""
    from quantbench.hosts.registry import make_host, resolve_hosts

    return make_host(resolve_hosts([name])[0])


# word (as the little-endian bytes LLVM prints, read as uint32) -> expected family
KNOWN = {
    0x2E829420: "UDOT (vector)",             # udot v0.2s, v1.8b, v2.8b
    0x4E829420: "SDOT (vector)",             # sdot v0.4s, v1.16b, v2.16b
    0x2F82E020: "UDOT (by element)",         # udot v0.2s, v1.8b, v2.4b[0]
    0x0FA2E020: "SDOT (by element)",         # sdot v0.2s, v1.8b, v2.4b[1]
    0x6F82E820: "UDOT (by element)",         # udot v0.4s, v1.16b, v2.4b[2]
    0x4FA2E820: "SDOT (by element)",         # sdot v0.4s, v1.16b, v2.4b[3]
    0x4E9FA601: "SMMLA",                     # smmla v1.4s, v16.16b, v31.16b
    0x6E9FA601: "UMMLA",
    0x4E9FAE01: "USMMLA",
    0x0E22C020: "SMULL (8-bit)",             # smull v0.8h, v1.8b, v2.8b
    0x4E22C020: "SMULL (8-bit)",             # smull2 v0.8h, v1.16b, v2.16b
    0x2E22C020: "UMULL (8-bit)",
    0x0E62C020: "SMULL (16-bit)",            # smull v0.4s, v1.4h, v2.4h
    0x0E228020: "SMLAL (8-bit)",             # smlal v0.8h, v1.8b, v2.8b
    0x4E228020: "SMLAL (8-bit)",             # smlal2
    0x2E228020: "UMLAL (8-bit)",
    0x4E606820: "SADALP",                    # sadalp v0.4s, v1.8h
    0x6E206820: "UADALP",                    # uadalp v0.8h, v1.16b
    0x4E22CC20: "FMLA (vector)",             # fmla v0.4s, v1.4s, v2.4s
    0x4F821020: "FMLA (by element)",         # fmla v0.4s, v1.4s, v2.s[0]
    0x65A20020: "SVE",                       # fmla z0.s, p0/m, z1.s, z2.s
    0x2518E3EF: "SVE",                       # ptrue p15.b
    0x2559E145: "SVE",                       # ptrues p5.h, vl32
    0xA540A000: "SVE",                       # ld1w {z0.s}, p0/z, [x0]
    0x80800000: "SME",                       # fmopa za0.s, p0/m, p0/m, z0.s, z0.s
    0xE0800000: "SME",                       # ld1w {za0h.s[w12, 0]}, p0/z, [x0, x0, lsl #2]
    0xC00800FF: "SME",                       # zero {za}
    0xD503477F: "SMSTART/SMSTOP",            # smstart
    0xD503467F: "SMSTART/SMSTOP",            # smstop
    0xD503437F: "SMSTART/SMSTOP",            # smstart sm
}
NOT_TRACKED = [
    0x0E22E020,  # pmull v0.8h, v1.8b, v2.8b (same group as smull, opcode 1110)
    0x0E22A020,  # smlsl v0.8h
    0x0E220020,  # saddl v0.8h
    0x4E602820,  # saddlp v0.4s, v1.8h (not accumulating)
    0xD503201F,  # nop
    0x0E829420 ^ 0x00400000,  # dot encoding with size 01: unallocated, not a dot product
]


@pytest.mark.parametrize("word,family", sorted(KNOWN.items()))
def test_decoder_known_words(word, family):
    assert decode_arm64(word)[0] == family


@pytest.mark.parametrize("word", NOT_TRACKED)
def test_decoder_rejects_other_words(word):
    assert decode_arm64(word) is None


def test_brief_masks_agree_on_udot_by_element():
    # the notes' test: (w & 0xbf00f400) == 0x2f00e000 for UDOT (by element)
    for w, fam in KNOWN.items():
        assert ((w & 0xBF00F400) == 0x2F00E000) == (fam == "UDOT (by element)")


def test_scan_arm_log_with_byte_lines_and_ranges():
    log = [
        "----------------",
        "IN: MlasGemmU8X8KernelUdot",
        "0x0000005501000000:  2f82e020      .byte 0x20, 0xe0, 0x82, 0x2f",
        "0x0000005501000004:  2f82e020      .byte 0x20, 0xe0, 0x82, 0x2f",
        "0x0000005501000008:  4e22cc20      fmla v0.4s, v1.4s, v2.4s",
        "0x0000005501000000:  2f82e020      .byte 0x20, 0xe0, 0x82, 0x2f",  # retranslated: same site
        "0x0000005501000010:  .byte 0x20, 0x94, 0x82, 0x2e",             # no word column
        "0x0000004000000000:  4e22c020      smull2 v0.8h, v1.16b, v2.16b",  # outside onnxruntime
        "",
    ]
    got = scan_log(log, "aarch64", ranges=[(0x5501000000, 0x5502000000)])
    assert set(got) == {"UDOT (by element)", "FMLA (vector)", "UDOT (vector)"}
    u = got["UDOT (by element)"]
    assert (u.sites, u.translations, u.from_bytes) == (2, 3, 3)
    assert got["UDOT (vector)"].from_bytes == 1
    assert scan_log(log, "aarch64")["SMULL (8-bit)"].sites == 1


def test_a_log_file_is_read_in_chunks_and_counts_as_its_lines(tmp_path, monkeypatch):
    """A trace is millions of lines: a file is matched in large chunks (small ones here), and counts the same as its
    lines one by one (lines across a chunk's end, words decoded once, directive lines, lines outside the ranges)."""
    from quantbench.explain import evidence

    monkeypatch.setattr(evidence, "LOG_CHUNK", 1000)
    block = ["----------------", "IN: MlasGemmU8X8KernelUdot",
             "0x0000005501000000:  2f82e020      .byte 0x20, 0xe0, 0x82, 0x2f",
             "0x0000005501000008:  4e22cc20      fmla v0.4s, v1.4s, v2.4s",
             "0x0000005501000010:  .byte 0x20, 0x94, 0x82, 0x2e",
             "0x000000550100001c:  d503201f      nop      ",
             "0x0000004000000000:  4e22c020      smull2 v0.8h, v1.16b, v2.16b", ""]
    lines = []
    for i in range(300):   # about 25 chunks
        lines += [ln.replace("0000005501000", f"00000055{i % 97:05x}") for ln in block]
    log = tmp_path / "in_asm.log"
    log.write_text("\n".join(lines) + "\n")
    for ranges in ([(0x5500000000, 0x5500030000)], None):
        by_file, by_line = scan_log(log, "aarch64", ranges), scan_log(lines, "aarch64", ranges)
        assert {k: vars(v) for k, v in by_file.items()} == {k: vars(v) for k, v in by_line.items()}
    assert by_file["UDOT (by element)"].translations == 300 and by_file["SMULL (8-bit)"].sites == 1


def test_scan_x86_log():
    log = [
        "0x7f0000001000:  c4 e2 7d 04 c1           vpmaddubsw %ymm1, %ymm0, %ymm0",
        "0x7f0000001005:  c5 fd f5 c2              vpmaddwd %ymm2, %ymm0, %ymm0",
        "0x7f000000100a:  c4 e2 f1 a9 c2           vfmadd213sd %xmm2, %xmm1, %xmm0",
        "0x7f000000100f:  48                       .byte    0x48",
        "0x7f0000001010:  48 89 e7                 movq     %rsp, %rdi",
    ]
    got = scan_log(log, "x86_64")
    assert {k: v.sites for k, v in got.items()} == {"PMADDWD": 1, "VFMADD": 1, "VPMADDUBSW": 1}
    assert x86_family("vpdpbusd")[0] == "VPDPBUSD" and x86_family("pmaddubsw")[0] == "VPMADDUBSW"
    assert x86_family("vpaddd") is None


@pytest.mark.slow
def test_pi_shows_dot_product_and_pi4_plain_neon(workdir):
    """A real emulated run of the static QDQ demo classifier on pi vs pi4 (1 fixture each)."""
    from quantbench.inputs.assets import demo_model, DEMO_CLASSIFIER
    from quantbench.hosts import emulated as EM
    from explain_helpers import classifier_fixtures, static_qdq

    for p in ("pi", "pi4"):
        ok, msg = EM.ready(p)
        if not ok:
            missing_setup(f"emulated host {p} not set up: {msg}")
    model = static_qdq(demo_model(DEMO_CLASSIFIER), workdir)
    fx = classifier_fixtures(model, 1)
    from quantbench.explain.evidence import collect
    from quantbench.hosts.startup import parallel

    pi, pi4 = parallel(lambda p: collect(p, emulated_host(p), model, fx), ["pi", "pi4"])  # two qemu processes at once
    dot = ("UDOT (by element)", "SDOT (by element)", "UDOT (vector)", "SDOT (vector)")
    neon = ("SMULL (8-bit)", "SMLAL (8-bit)", "UMULL (8-bit)", "UMLAL (8-bit)", "SADALP", "UADALP")
    assert pi.has(dot), pi.families
    assert not pi4.has(dot), pi4.families
    assert pi4.has(neon), pi4.families
    assert pi.fingerprint_id != pi4.fingerprint_id
    assert "dot-product" in pi.verdict() and "plain NEON" in pi4.verdict()
    rows = pi.rows() + pi4.rows()
    assert all(r["fingerprint_id"] in (pi.fingerprint_id, pi4.fingerprint_id) for r in rows)


@pytest.mark.slow
def test_the_sme_phone_runs_kleidiais_sme_kernels_and_its_sve_twin_does_not(workdir):
    """The fp32 demo classifier (1 fixture) on phone-sme2 and graviton4: SME instructions (KleidiAI's kernels, named
    with the entry points the wheel carries) on the phone only; with mlas.disable_kleidiai=1 none on the phone."""
    from quantbench.inputs.assets import demo_model, DEMO_CLASSIFIER
    from quantbench.hosts import emulated as EM
    from quantbench.explain.evidence import ARM_SME, collect, table
    from quantbench.hosts.startup import parallel
    from explain_helpers import classifier_fixtures

    for p in ("phone-sme2", "graviton4"):
        ok, msg = EM.ready(p)
        if not ok:
            missing_setup(f"emulated host {p} not set up: {msg}")
    model = demo_model(DEMO_CLASSIFIER)
    fx = classifier_fixtures(model, 1)
    off = {"config_entries": {"mlas.disable_kleidiai": "1"}}
    phone, twin, phone_off = parallel(lambda a: collect(a[0], emulated_host(a[0]), model, fx, a[1]),
                                      [("phone-sme2", None), ("graviton4", None), ("phone-sme2", off)])
    assert phone.has(ARM_SME) and phone.has(("SVE",)), phone.families
    assert "KleidiAI SME kernels" in phone.verdict()
    assert "ArmKleidiAI::MlasGemmBatch" in phone.kleidiai
    assert "its onnxruntime runs them from ArmKleidiAI::" in table([phone, twin])
    assert not twin.has(ARM_SME) and "KleidiAI" not in twin.verdict()
    assert not phone_off.has(ARM_SME), phone_off.families


@pytest.mark.slow
def test_avx2_shows_vpmaddubsw(workdir):
    """The saturating U8S8 kernel is seen in qemu's log on Haswell (one fixture)."""
    from explain_helpers import fixture, saturating_inputs, saturating_matmul, static_qdq
    from quantbench.explain.evidence import collect
    from quantbench.hosts import emulated as EM

    ok, msg = EM.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    qdq = static_qdq(saturating_matmul(workdir / "fp32.onnx"), workdir, "qdq", feeds=saturating_inputs(count=4, seed=7))
    ev = collect("x86-avx2", emulated_host("x86-avx2:qemu"), qdq, [fixture(saturating_inputs(count=1)[0])])
    assert ev.arch == "x86_64" and ev.qemu_cpu == "Haswell"
    assert ev.families["VPMADDUBSW"].sites > 0
    assert "VPDPBUSD" not in ev.families  # no VNNI on Haswell
    assert "saturate" in ev.verdict()
    assert any("onnxruntime" in r for r in ev.ranges)


def test_verdicts_use_the_decoder_family_names():
    from quantbench.explain.evidence import ARM_INT8_DOT, ARM_INT8_MMLA, ARM_NEON_INT8, Evidence, FamilyCount

    decoded = {decode_arm64(w)[0] for w in KNOWN}
    assert set(ARM_INT8_DOT) >= {f for f in decoded if "DOT" in f}
    assert set(ARM_INT8_MMLA) >= {f for f in decoded if "MMLA" in f}
    assert {f for f in decoded if f.endswith("(8-bit)") or f.endswith("ADALP")} <= set(ARM_NEON_INT8)

    def ev(arch, *fams):
        return Evidence("h", "p", "cpu", arch, "v", "vid", "fid", {}, [],
                        {f: FamilyCount(f, "k", 1, 1, 0) for f in fams})

    assert "dot-product" in ev("aarch64", "UDOT (by element)", "UADALP").verdict()
    assert "matrix-multiply" in ev("aarch64", "SMMLA", "UDOT (vector)").verdict()
    assert "plain NEON" in ev("aarch64", "SMULL (8-bit)", "SADALP").verdict()
    sme = ev("aarch64", "SMSTART/SMSTOP", "SME", "SVE", "SMMLA").verdict()
    assert sme.startswith("int8 matrix-multiply") and "KleidiAI SME kernels" in sme and sme.endswith("SVE kernels")
    assert "KleidiAI" not in ev("aarch64", "SVE", "UDOT (vector)").verdict()
    assert "VNNI" in ev("x86_64", "VPDPBUSD", "VPMADDUBSW").verdict()
    assert "saturate" in ev("x86_64", "VPMADDUBSW", "PMADDWD").verdict()
    assert "exact" in ev("x86_64", "PMADDWD").verdict()


def test_hosts_without_a_translation_log_are_skipped_with_a_note(tmp_path):
    """The host says whether it can be traced: a local or ssh host is skipped (no worker starts, nothing written)."""
    from quantbench.explain.evidence import run_evidence_for
    from quantbench.hosts.registry import HostRequest, HostSpec, parse_hosts

    lab = HostRequest("lab", HostSpec("lab", "ssh", {"address": "pi@lab.invalid"}), {})
    evs, notes = run_evidence_for(None, parse_hosts("x86") + [lab], [], tmp_path / "t")
    assert evs == []
    assert notes == [f"evidence: {h} is a {k} host; instruction evidence needs qemu's translation log "
                     f"(an emulated host), skipped" for h, k in (("x86", "local"), ("lab", "ssh"))]
    assert not (tmp_path / "t").exists()


def test_the_aarch64_wheels_kleidiai_entry_points_are_named_from_its_bytes():
    """The wheel's symbol table is stripped; the RTTI names of KleidiAI's thread-pool lambdas name its entry points."""
    from quantbench.explain.evidence import kleidiai_entry_points

    blob = (b"\0*ZN11ArmKleidiAI13MlasGemmBatchE15CBLAS_TRANSPOSES0_mmmPK22MLAS_SGEMM_DATA_PARAMSEUllE_\0"
            b"*ZN11ArmKleidiAI21MlasDynamicQGemmBatchERK32MLAS_GEMM_DYN_QUANT_SHAPE_PARAMSEUllE0_\0")
    assert kleidiai_entry_points(blob) == ["ArmKleidiAI::MlasDynamicQGemmBatch", "ArmKleidiAI::MlasGemmBatch"]
    assert kleidiai_entry_points(b"\0MlasGemmBatch\0") == []
