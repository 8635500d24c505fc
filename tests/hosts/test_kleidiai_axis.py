"""KleidiAI is a runtime axis: `mlas.disable_kleidiai` is a session config key onnxruntime knows (its x86-64 build
keeps the key only as instruction immediates, its aarch64 build as a string), so it works as any session entry."""

from __future__ import annotations

from quantbench.hosts.registry import parse_hosts
from quantbench.inputs.configkeys import known_keys, library_keys


def test_the_key_is_known_from_its_head_where_the_compiler_inlined_it():
    inlined = b"\x00\x01mlas.disable_kle\x02\x00session.x64quantprecision\x00"  # the head among other bytes
    assert library_keys(inlined) == ["mlas.disable_kleidiai", "session.x64quantprecision"]
    # a library of a version without the key (onnxruntime 1.20/1.21) holds neither the key nor its head
    assert library_keys(b"\x00mlas.enable_gemm_fastmath_arm64_bfloat16\x00") == [
        "mlas.enable_gemm_fastmath_arm64_bfloat16"]
    assert "mlas.disable_kleidiai" in known_keys()   # this interpreter's onnxruntime 1.32


def test_disabling_kleidiai_is_a_session_entry_of_a_hosts_item():
    [req] = parse_hosts("phone-sme2+mlas.disable_kleidiai=1")
    assert req.spec.name == "phone-sme2" and req.label == "phone-sme2+mlas.disable_kleidiai=1"
    assert req.session["config_entries"] == {"mlas.disable_kleidiai": "1"}
    assert req.session["intra_op_num_threads"] == 8   # the phone's deployed count stays
