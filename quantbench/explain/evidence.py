"""Kernel evidence: which instruction families onnxruntime ran on an emulated host.

The variant runs under qemu-user with ``-d in_asm``: qemu logs every instruction it
translates. A small probe (standard library + numpy + onnxruntime, like the worker)
reports the address ranges where onnxruntime's code is mapped in the guest, so
only instructions inside onnxruntime (MLAS is linked into it) are counted - not
Python's or numpy's. Counts are of *translations* (a line of the log) and of
distinct *sites* (addresses): qemu translates a block once and then reuses it, so
neither is an execution count; a family with sites > 0 was dispatched.

ARM words are decoded from their 32-bit encodings (the log prints the word before
the mnemonic), so instructions that qemu's disassembler prints as ``.byte`` or
``.inst`` (UDOT/SDOT by element, the i8mm MMLA family under qemu 7.2) are counted
too. Encodings (Arm ARM, Advanced SIMD; checked against LLVM's MC test vectors):

  UDOT/SDOT (vector)      0 Q U 01110 10 0 Rm 100101 Rn Rd    mask 0x9fe0fc00 == 0x0e809400
  UDOT/SDOT (by element)  0 Q U 01111 10 L M Rm 1110 H 0 Rn Rd mask 0x9fc0f400 == 0x0f80e000
  USDOT (vector)          0 Q 0 01110 10 0 Rm 100111 Rn Rd    mask 0xbfe0fc00 == 0x0e809c00
  SUDOT/USDOT (by elem.)  0 Q 0 01111 s0 L M Rm 1111 H 0 Rn Rd mask 0xbf40f400 == 0x0f00f000
  SMMLA / UMMLA / USMMLA  0x4e80a400 / 0x6e80a400 / 0x4e80ac00 with mask 0xffe0fc00
  SMULL/UMULL (vector)    0 Q U 01110 sz 1 Rm 110000 Rn Rd    mask 0x9f20fc00 == 0x0e20c000
  SMLAL/UMLAL (vector)    0 Q U 01110 sz 1 Rm 100000 Rn Rd    mask 0x9f20fc00 == 0x0e208000
  SADALP/UADALP           0 Q U 01110 sz 10000 0011010 Rn Rd  mask 0x9f3ffc00 == 0x0e206800
  FMLA (vector)           0 Q 0 01110 0 sz 1 Rm 110011 Rn Rd  mask 0xbfa0fc00 == 0x0e20cc00
  FMLA (by element)       0 Q 0 01111 1 sz L M Rm 0001 H 0     mask 0xbf80f400 == 0x0f801000
  SVE (any)               bits 28:25 = 0010, the SVE encoding group  mask 0x1e000000 == 0x04000000
  SME (any)               bit 31 = 1, bits 28:25 = 0000: the SME group (FMOPA/SMOPA outer products, ZA loads
                          and stores, MOVA)                           mask 0x9e000000 == 0x80000000
  SMSTART/SMSTOP          MSR SVCR*, #imm (streaming mode, ZA on/off) mask 0xfffff0ff == 0xd503407f

SME instructions run only in KleidiAI's kernels (MLAS installs them where the CPU has SME: the fp32 SGEMM, the
convolution and the dynamic-quantization MatMul), so a site of either SME family names KleidiAI's SME kernels;
the library's own KleidiAI entry points are read from its bytes (`kleidiai_entry_points`: the aarch64 wheel keeps
their RTTI names, `ArmKleidiAI::MlasGemmBatch` ..., though its symbol table is stripped).

(U is bit 29.) The 8-bit SMULL/SMLAL forms (size 00) are the int16 pair path of
NEON-only cores; wider forms are listed apart. x86 instructions are variable
length, so they are matched by mnemonic.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantbench.store import partwrite
from quantbench.fsutil import content_key
from quantbench.hosts.keys import hosts_row, normalize_session
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.registry import make_host
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.textfmt import text_table

# (mask, value, family, kind); order matters only for overlapping encodings (none overlap)
ARM_PATTERNS = [
    (0x9FC0F400, 0x0F80E000, "UDOT/SDOT (by element)", "int8-dot"),
    (0x9FE0FC00, 0x0E809400, "UDOT/SDOT (vector)", "int8-dot"),
    (0xBFE0FC00, 0x0E809C00, "USDOT (vector)", "int8-dot"),
    (0xBF40F400, 0x0F00F000, "SUDOT/USDOT (by element)", "int8-dot"),
    (0xFFE0FC00, 0x4E80A400, "SMMLA", "int8-matmul"),
    (0xFFE0FC00, 0x6E80A400, "UMMLA", "int8-matmul"),
    (0xFFE0FC00, 0x4E80AC00, "USMMLA", "int8-matmul"),
    (0x9F20FC00, 0x0E20C000, "MULL", "widening"),
    (0x9F20FC00, 0x0E208000, "MLAL", "widening"),
    (0x9F3FFC00, 0x0E206800, "ADALP", "pairwise-accumulate"),
    (0xBFA0FC00, 0x0E20CC00, "FMLA (vector)", "fp32-fma"),
    (0xBF80F400, 0x0F801000, "FMLA (by element)", "fp32-fma"),
    (0x1E000000, 0x04000000, "SVE", "sve"),   # the whole SVE group: MLAS's SVE kernels (erf, logistic, softmax)
    (0x9E000000, 0x80000000, "SME", "sme"),   # the whole SME group: KleidiAI's SME kernels
    (0xFFFFF0FF, 0xD503407F, "SMSTART/SMSTOP", "sme"),
]
ARM_SME = ("SME", "SMSTART/SMSTOP")
_KLEIDIAI = re.compile(rb"N11ArmKleidiAI(\d+)([A-Za-z_]\w*)")


def kleidiai_entry_points(data: bytes) -> list[str]:
    """The KleidiAI entry points an onnxruntime library's bytes name (`ArmKleidiAI::MlasGemmBatch`, ...: the RTTI
    names of their thread-pool lambdas, which a stripped library keeps): what its SME kernels run from."""
    out = set()
    for m in _KLEIDIAI.finditer(data):
        n = int(m.group(1))
        out.add("ArmKleidiAI::" + m.group(2)[:n].decode("ascii", "replace"))
    return sorted(out)

X86_FAMILIES = [
    (re.compile(r"^v?pmaddubsw$"), "VPMADDUBSW", "int8-saturating-pair"),
    (re.compile(r"^vpdpbusds?$"), "VPDPBUSD", "int8-dot"),
    (re.compile(r"^vpdpb[su]{2}ds?$"), "VPDPB (AVX-VNNI-INT8)", "int8-dot"),
    (re.compile(r"^tdpb[su]{2}d$"), "TDPBUSD (AMX)", "int8-matmul"),
    (re.compile(r"^v?pmaddwd$"), "PMADDWD", "int16-pair"),
    (re.compile(r"^vf(n)?madd(132|213|231)?[ps][sd]$|^vf(n)?madd"), "VFMADD", "fp32-fma"),
]

# Families that tell the int8 kernel apart, per architecture (for the summary)
ARM_INT8_DOT = ("UDOT (by element)", "SDOT (by element)", "UDOT (vector)", "SDOT (vector)", "USDOT (vector)",
                "USDOT (by element)", "SUDOT (by element)")
ARM_INT8_MMLA = ("SMMLA", "UMMLA", "USMMLA")
ARM_NEON_INT8 = ("SMULL (8-bit)", "UMULL (8-bit)", "SMLAL (8-bit)", "UMLAL (8-bit)", "SADALP", "UADALP")


def decode_arm64(word: int) -> tuple[str, str] | None:
    """(family, kind) of a 32-bit A64 instruction word, or None if not a tracked family."""
    w = int(word) & 0xFFFFFFFF
    for mask, value, family, kind in ARM_PATTERNS:
        if (w & mask) == value:
            u = (w >> 29) & 1
            size = (w >> 22) & 3
            if family in ("MULL", "MLAL"):
                sign = "U" if u else "S"
                width = "8-bit" if size == 0 else ("16-bit" if size == 1 else "32-bit")
                return f"{sign}{family} ({width})", "int8-widening" if size == 0 else kind
            if family == "ADALP":
                return ("UADALP" if u else "SADALP"), kind
            if family.startswith("UDOT/SDOT"):
                return ("UDOT" if u else "SDOT") + family[len("UDOT/SDOT"):], kind
            if family == "SUDOT/USDOT (by element)":
                return ("USDOT (by element)" if size == 2 else "SUDOT (by element)"), kind
            return family, kind
    return None


def x86_family(mnemonic: str) -> tuple[str, str] | None:
    m = mnemonic.strip().lower()
    for rx, family, kind in X86_FAMILIES:
        if rx.search(m):
            return family, kind
    return None


_LINE = re.compile(r"^\s*0x([0-9a-fA-F]+):\s+(.*)$")
_LINES = re.compile(r"^[^\S\n]*0x([0-9a-fA-F]+):[^\S\n]+(.*)$", re.M)   # _LINE over many lines at once
_NO_WORD = object()   # a line's rest that does not start with a word column
LOG_CHUNK = 1 << 22   # characters of a log file matched at once
_WORD_FIRST = re.compile(r"([0-9a-fA-F]{8})(?:\s+(.*))?$", re.S)
_BYTE_LIST = re.compile(r"\.(?:byte|inst|word)\s+(.*)$")
_X86_COLUMNS = re.compile(r"\s{2,}")   # address: bytes  mnemonic operands


def _word_from_directive(text: str) -> int | None:
    m = _BYTE_LIST.search(text)
    if not m:
        return None
    vals = [v.strip() for v in m.group(1).split(",") if v.strip()]
    try:
        nums = [int(v, 16) if v.lower().startswith("0x") else int(v) for v in vals]
    except ValueError:
        return None
    if len(nums) == 4 and all(0 <= n < 256 for n in nums):
        return nums[0] | nums[1] << 8 | nums[2] << 16 | nums[3] << 24
    if len(nums) == 1:
        return nums[0] & 0xFFFFFFFF
    return None


@dataclass
class FamilyCount:
    family: str
    kind: str
    sites: int = 0
    translations: int = 0
    from_bytes: int = 0


def _instruction_lines(lines):
    """(address in hex, the rest) of each instruction line of a log: a file is read in large chunks matched at
    once (a trace has millions of lines), any other iterable line by line."""
    if not hasattr(lines, "read"):
        for line in lines:
            m = _LINE.match(line)
            if m:
                yield m.group(1), m.group(2)
        return
    carry = ""
    while chunk := lines.read(LOG_CHUNK):
        chunk = carry + chunk
        cut = chunk.rfind("\n") + 1
        carry = chunk[cut:]
        yield from _LINES.findall(chunk, 0, cut)
    yield from _LINES.findall(carry)


def _arm_word(rest: str, decoded: dict):
    """(family found or None, the text after the word) of an ARM line's rest; `decoded` caches a line's leading
    word column (qemu prints the word before the mnemonic): a log has millions of lines over a few thousand words."""
    head = rest[:9]
    if head in decoded:
        found = decoded[head]
    else:
        w = _WORD_FIRST.match(head)
        found = decoded[head] = decode_arm64(int(w.group(1), 16)) if w else _NO_WORD
    if found is not _NO_WORD:
        return found, rest[8:]
    word = _word_from_directive(rest)
    return (None if word is None else decode_arm64(word)), rest


def scan_log(lines, arch: str, ranges=None) -> dict[str, FamilyCount]:
    """Stream a qemu -d in_asm log (an iterable of lines, or a path); count families inside `ranges`.

    `ranges`: [(lo, hi), ...] guest address ranges to count (None: everything). Only
    the set of addresses per family is kept, never the log.
    """
    if isinstance(lines, (str, os.PathLike)):
        with open(lines, "r", errors="replace") as fh:
            return scan_log(fh, arch, ranges)
    arm = arch in ("aarch64", "arm64")
    ranges = sorted(ranges or [])
    counts: dict[str, FamilyCount] = {}
    sites: dict[str, set] = defaultdict(set)
    decoded: dict = {}
    for hex_addr, rest in _instruction_lines(lines):
        from_bytes = False
        if arm:   # the family first: most lines are of no tracked family, and are left before their address is read
            found, tail = _arm_word(rest, decoded)
            if found is None:
                continue
            from_bytes = bool(_BYTE_LIST.search(tail)) or ".byte" in tail
        else:
            parts = _X86_COLUMNS.split(rest.strip())
            mnem = parts[1].split()[0] if len(parts) > 1 and parts[1] else ""
            if not mnem or mnem.startswith("."):
                continue
            if mnem not in decoded:
                decoded[mnem] = x86_family(mnem)
            found = decoded[mnem]
            if found is None:
                continue
        addr = int(hex_addr, 16)
        if ranges and not any(lo <= addr < hi for lo, hi in ranges):
            continue
        family, kind = found
        c = counts.get(family)
        if c is None:
            c = counts[family] = FamilyCount(family, kind)
        c.translations += 1
        c.from_bytes += int(from_bytes)
        sites[family].add(addr)
    for family, c in counts.items():
        c.sites = len(sites[family])
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- the run under qemu (the host's trace)

@dataclass
class Evidence:
    host: str
    preset: str
    qemu_cpu: str
    arch: str
    variant: str
    variant_id: str
    fingerprint_id: str
    fingerprint: dict
    fixtures: list
    families: dict = field(default_factory=dict)  # family -> FamilyCount
    log_bytes: int = 0
    ranges: list = field(default_factory=list)
    #: the KleidiAI entry points its onnxruntime library carries (aarch64; kleidiai_entry_points)
    kleidiai: list = field(default_factory=list)

    @property
    def evidence_id(self) -> str:
        return content_key([self.fingerprint_id, self.variant_id, self.fixtures, self.qemu_cpu])

    def rows(self) -> list[dict]:
        return [{"evidence_id": self.evidence_id, "host": self.host, "fingerprint_id": self.fingerprint_id,
                 "qemu_cpu": self.qemu_cpu, "variant_id": self.variant_id, "variant": self.variant, "arch": self.arch,
                 **{k: v for k, v in asdict(c).items()}} for c in self.families.values()]

    def has(self, families) -> bool:
        return any(self.families.get(f) and self.families[f].sites for f in families)

    def verdict(self) -> str:
        """One line: which int8 kernel family this host dispatched (on ARM: and the SME/SVE kernels that ran)."""
        if self.arch == "aarch64":
            extra = [what for fams, what in ((ARM_SME, "KleidiAI SME kernels (streaming mode, ZA outer products)"),
                                             (("SVE",), "SVE kernels")) if self.has(fams)]
            return "; ".join([self._int8_verdict(), *extra])
        return self._int8_verdict()

    def _int8_verdict(self) -> str:
        f = self.families
        if self.arch == "aarch64":
            if self.has(ARM_INT8_MMLA):
                return "int8 matrix-multiply kernels (i8mm MMLA): exact"
            if self.has(ARM_INT8_DOT):
                return "int8 dot-product kernels (UDOT/SDOT): exact"
            if self.has(ARM_NEON_INT8):
                return "plain NEON int8 kernels (SMULL/SMLAL/UMULL/SADALP/UADALP): int16 pair sums"
            return "no int8 GEMM instructions seen" + (" (fp32 FMLA kernels)" if self.has(("FMLA (vector)", "FMLA (by element)")) else "")
        if self.has(("VPDPBUSD", "VPDPB (AVX-VNNI-INT8)")):
            return "VNNI int8 kernels (VPDPBUSD): exact"
        if self.has(("VPMADDUBSW",)):
            return "AVX2 U8S8 kernel (VPMADDUBSW): int16 pair sums saturate"
        if self.has(("PMADDWD",)):
            return "SSE/AVX int16 kernels (PMADDWD): exact"
        return "no int8 GEMM instructions seen" + (" (fp32 FMA kernels)" if "VFMADD" in f else "")


def collect(host_name: str, host, model_path, fixtures, session: dict | None = None,
            variant_name: str = "", keep_log: str | None = None, timeout: float | None = None,
            variant_id: str | None = None) -> Evidence:
    """Run the model on `fixtures` on `host` (one that traces instructions: EmulatedHost.trace_run) under
    qemu's -d in_asm and count the instruction families (`variant_id`: the model's semantic hash when the
    caller has it; else the model is read for it)."""
    preset = host.trace_target()
    session = normalize_session(session)
    vid = variant_id or semantic_sha256(load_model(model_path, check=False))
    with tempfile.TemporaryDirectory(prefix="qb-evidence-") as tmp:
        log = Path(keep_log) if keep_log else Path(tmp) / "in_asm.log"
        info = host.trace_run(host_name, model_path, fixtures, session, log, timeout)
        families = scan_log(log, preset.arch, [(lo, hi) for lo, hi, _ in info["ranges"]])
        size = log.stat().st_size
    return Evidence(host=host_name, preset=preset.name, qemu_cpu=preset.qemu_cpu, arch=preset.arch,
                    variant=variant_name or Path(model_path).stem, variant_id=vid,
                    fingerprint_id=info["fingerprint_id"], fingerprint=info["fingerprint"],
                    fixtures=[o["fixture_id"] for o in info["outputs"]], families=families, log_bytes=size,
                    ranges=[r[2] for r in info["ranges"]],
                    kleidiai=_library_entry_points(info["ranges"]) if preset.arch == "aarch64" else [])


def _library_entry_points(ranges) -> list[str]:
    """The KleidiAI entry points of the onnxruntime libraries mapped in the guest (their files are this machine's:
    the wheels' folder is on the guest's path as it is here)."""
    out: set = set()
    for path in sorted({r[2] for r in ranges}):
        try:
            out.update(kleidiai_entry_points(Path(path).read_bytes()))
        except OSError:
            continue
    return sorted(out)


def table(evs: list[Evidence]) -> str:
    fams = sorted({f for e in evs for f in e.families})
    rows = [[f] + [e.families[f].sites if f in e.families else None for e in evs] for f in fams]
    lines = [text_table(["family"] + [e.host for e in evs], rows)]
    lines += [f"{e.host} ({e.qemu_cpu}): {e.verdict()}" for e in evs]
    lines += [f"{e.host}: its onnxruntime runs them from {', '.join(e.kleidiai)}" for e in evs
              if e.kleidiai and e.has(ARM_SME)]
    return "\n".join(lines)


def run_evidence_for(variant, hosts, fixtures, root, variant_id: str | None = None) -> tuple[list[Evidence], list[str]]:
    """Instruction evidence on every emulated host among `hosts`; returns (evidence, notes on hosts skipped).
    `variant_id`: the variant's semantic hash when the caller has it (the run plan)."""
    evs, notes = [], []
    for h in hosts:
        host = make_host(h.spec)
        if not host.traces_instructions:
            hint = f" (name it {h.spec.name}:qemu)" if KINDS[h.spec.kind].tier_kind else ""   # a tier's qemu way
            notes.append(f"evidence: {h.label} is a {h.spec.kind} host; instruction evidence needs qemu's translation "
                         f"log (an emulated host{hint}), skipped")
            continue
        ev = collect(h.label, host, variant.path, fixtures, h.session, variant.name, variant_id=variant_id)
        partwrite.append("hosts", [hosts_row(h.spec.name, h.spec.kind, ev.fingerprint, ev.fingerprint_id)], root=root)
        partwrite.append("evidence", ev.rows(), root=root)
        evs.append(ev)
    return evs, notes
