"""Evaluating the tier predictor against measured classes (tests/analysis/test_predict.py and
scripts/bench_predict.py)."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench.analysis import predict as PR
from quantbench import worker as W
from quantbench.store.hostresults import load_hosts


def leave_one_out(table: PR.DispatchTable, routines: dict, shown: dict[str, tuple[list, str]],
                  config: dict | None = None) -> list[dict]:
    """For each shown host: predicted from the others, against its measured class (mates = the other hosts in it)."""
    rows = []
    for h, (feats, cls) in sorted(shown.items()):
        others = {k: v for k, v in shown.items() if k != h}
        [p] = PR.predict(table, routines, others, {h: feats}, config)
        predicted = sorted(k for k, (_, c) in others.items() if p.joins is not None and c == p.joins)
        measured = sorted(k for k, (_, c) in others.items() if c == cls)
        rows.append({"host": h, "predicted": predicted, "measured": measured, "agree": predicted == measured,
                     "deciding": p.deciding})
    return rows


def identities(work: Path, report: dict) -> dict[str, dict]:
    """host -> its selected fingerprint's identity (the vector lengths sit there) over equiv's host summary, for an
    equiv run in `work` whose equiv.json is `report`."""
    rows = load_hosts(host=sorted(report["hosts"]), tables_root=work / "results" / "tables",
                      columns=["host", "fingerprint_id", "fingerprint"]).to_pylist()
    fps = {(r["host"], r["fingerprint_id"]): json.loads(r["fingerprint"] or "{}").get("identity", {}) for r in rows}
    return {h: {**i, **fps.get((h, i["fingerprint_id"]), {})} for h, i in report["hosts"].items()}


# HWCAP names of the CPUs qemu-user 10.0 models (the dispatch-relevant ones and a few beside them), as a guest reads
# them from AT_HWCAP/AT_HWCAP2 (its `max` shows SME, not SME2)
ARM_BASE = ("fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "cpuid")
ARM_DOT = ARM_BASE + ("atomics", "fphp", "asimdhp", "asimdrdm", "lrcpc", "dcpop", "asimddp")
ARM_V1 = ARM_DOT + ("sve", "svei8mm", "svebf16", "i8mm", "bf16")
ARM_N2 = ARM_V1 + ("sve2", "svebitperm")
ARM_MAX = ARM_N2 + ("sme", "sme_i8i32", "sme_f32f32")

#: the demo detector under qemu-user 10 (notes/emulated-hosts.md, Armv9 section: 4 inputs, 1 thread): qemu -cpu ->
#: (HWCAP names, SVE bits, SME bits, fp32 hash, dynamic hash); static-minmax was e3653dab on every one
ARM_MEASURED = {
    "cortex-a72": (ARM_BASE, 0, 0, "d3015bab", "53c40ae0"),
    "cortex-a76": (ARM_DOT, 0, 0, "d3015bab", "53c40ae0"),
    "neoverse-n1": (ARM_DOT, 0, 0, "d3015bab", "53c40ae0"),
    "neoverse-v1": (ARM_V1, 256, 0, "d3601f50", "394dab06"),
    "neoverse-n2": (ARM_N2, 128, 0, "3859e0fb", "691fdde2"),
    "cortex-a710": (ARM_N2, 128, 0, "3859e0fb", "691fdde2"),
    "max,sme=off,sve-default-vector-length=16": (ARM_N2, 128, 0, "3859e0fb", "691fdde2"),
    "max,sme=off": (ARM_N2, 512, 0, "41974d69", "708f8bb8"),
    "max,sve-default-vector-length=16,sme-default-vector-length=64": (ARM_MAX, 128, 512, "65b8e8cf", "86e26a9a"),
    "max,sve-default-vector-length=32": (ARM_MAX, 256, 256, "ca7dffc9", "a036aec8"),
    "max": (ARM_MAX, 512, 256, "d1e2facc", "2bd51337"),
}


def arm_identity(hwcaps, sve_bits: int, sme_bits: int, threads: int = 1) -> dict:
    """A fingerprint identity of an aarch64 guest as the worker builds it: its CPU identity and ISA flags decoded
    from AT_HWCAP/AT_HWCAP2 words (worker.fingerprint._cpu_identity), its vector lengths as prctl gave them (0: none), its
    normalized session."""
    words = {"hwcap": 0, "hwcap2": 0}
    for name in hwcaps:
        key, names = ("hwcap", W.ARM64_HWCAP) if name in W.ARM64_HWCAP else ("hwcap2", W.ARM64_HWCAP2)
        words[key] |= 1 << names.index(name)
    cpu, isa = W.fingerprint._cpu_identity("aarch64", {"features": sorted(hwcaps)}, words)
    vectors = dict(zip(W.arm_vector_lengths("aarch64"), (sve_bits, sme_bits)))   # the worker's names, its order
    return {"arch": "aarch64", "cpu": cpu, "isa_flags": isa, **vectors,
            "session": W.normalize_session({"intra_op_num_threads": threads})}
