"""Equivalence classes: hosts whose outputs are byte-identical over every fixture.

Equality is decided by the output hashes only (a tolerance never decides
equality). Per variant: the classes, how many fixtures each pair of hosts
agrees on, and the smallest set of fingerprint features (ISA flags,
onnxruntime version, session options, architecture, CPU identity) whose values
tell the classes apart: an exhaustive search over small subsets, smallest first,
preferring the ISA flags onnxruntime's kernel dispatch reads (analysis/tiers.py). Besides
that smallest set, `separation` names every feature that differs between the classes
(the same value within each class): the dispatch-read ones first, in MLAS's order, the
count of the others, and which of them the kernels used where qemu kernel evidence says.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass

from quantbench.analysis.tiers import DISPATCH, INT8_ONLY, canonical_flag, dispatch_rank, int8_path

# lower rank = preferred when several feature sets of the same size separate: a session
# option or library version explains more than hardware; across architectures the
# architecture explains more than any one ISA flag (x86 and ARM flag names do not compare)
# what names a separation first: the architecture and ISA, then the runtime and session, then the CPU's name
_PRIORITY = ("arch", "isa:", "sve_vector_bits", "sme_vector_bits", "ort_version", "session.", "cpu", "fp.")
#: an aarch64 fingerprint's vector lengths (bits, read in the guest by prctl): MLAS's SVE kernels and KleidiAI's SME
#: ones follow them, so they name a separation as the ISA flags do
VECTOR_FEATURES = ("sve_vector_bits", "sme_vector_bits")
# fingerprint keys that identify a machine or a moment, never the arithmetic
_NOISE = ("hostname", "host", "node", "time", "date", "pid", "path", "address", "user", "uptime", "boot",
          "fingerprint_id", "kind", "name", "memory", "mem", "ram")


@dataclass
class EqClass:
    label: str              # A, B, C ... in order of each class's first host
    hosts: list
    digest: str             # SHA-256 over the sorted (fixture, output, sha256) lines

    def as_dict(self) -> dict:
        return asdict(self)


def _label(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def hashes_digest(hashes: dict) -> str:
    """One digest of a host's {(fixture_id, output_name): sha256}."""
    h = hashlib.sha256()
    for (fx, out), sha in sorted(hashes.items()):
        h.update(f"{fx}|{out}|{sha}\n".encode())
    return h.hexdigest()


def equivalence_classes(host_hashes: dict) -> list[EqClass]:
    """Group hosts (in the given order) by identical output hashes over all fixtures."""
    by_digest: dict[str, EqClass] = {}
    for host, hashes in host_hashes.items():
        d = hashes_digest(hashes)
        if d not in by_digest:
            by_digest[d] = EqClass(label=_label(len(by_digest)), hosts=[], digest=d)
        by_digest[d].hosts.append(host)
    return list(by_digest.values())


def fixture_agreement(host_hashes: dict) -> dict:
    """(host a, host b) -> number of fixtures on which every output hash agrees (a before b in order)."""
    per_fixture = {}
    for host, hashes in host_hashes.items():
        fx: dict = {}
        for (fixture, out), sha in sorted(hashes.items()):
            fx.setdefault(fixture, []).append((out, sha))
        per_fixture[host] = fx
    hosts = list(host_hashes)
    out = {}
    for a, b in itertools.combinations(hosts, 2):
        fa, fb = per_fixture[a], per_fixture[b]
        out[(a, b)] = sum(1 for f in fa if fb.get(f) == fa[f])
    return out


def _flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) or x is None for x in obj):
        out[prefix] = json.dumps(sorted(map(str, obj)))
    elif isinstance(obj, (list, tuple)):
        out[prefix] = json.dumps(obj, sort_keys=True, default=str)
    else:
        out[prefix] = obj


def _is_noise(key: str) -> bool:
    last = key.rsplit(".", 1)[-1].lower()
    return any(last == n or last.startswith(n + "_") or last.endswith("_" + n) for n in _NOISE)


def fingerprint_features(arch=None, cpu=None, isa_flags=(), ort_version=None, session_options=None,
                         fingerprint=None, vectors=None) -> dict:
    """A flat {feature: value} view of what can change a host's numbers.

    ISA flags become one boolean feature each (``isa:avx2``, under its /proc/cpuinfo
    name: tiers.canonical_flag) so that the search can name the single flag that
    matters; `vectors`, an aarch64 host's SVE/SME vector lengths, as themselves (VECTOR_FEATURES); session
    options are flattened under ``session.``; the remaining fingerprint keys (minus identity noise such as
    host names) under ``fp.``, as a last resort.
    """
    feats: dict = {"arch": arch, "cpu": cpu, "ort_version": ort_version}
    for flag in isa_flags or ():
        feats[f"isa:{canonical_flag(flag)}"] = True
    feats.update({k: int(v) for k, v in (vectors or {}).items() if k in VECTOR_FEATURES})
    flat: dict = {}
    _flatten(session_options or {}, "", flat)
    for k, v in flat.items():
        feats[f"session.{k}"] = v
    flat = {}
    _flatten(fingerprint or {}, "", flat)
    for k, v in flat.items():
        if not _is_noise(k) and not any(x in k.lower() for x in ("flags", "features", "hwcap")):
            feats[f"fp.{k}"] = v
    return feats


def without_mask_cpu(features: dict, mechanisms: dict) -> dict:
    """`features` (host -> {feature: value}) without the "cpu" name when a host's CPU is shown through a masked
    CPUID (`mechanisms`: host -> "native-masked" | "qemu" | "real"): its vendor and model string are the mask's,
    not a CPU that computed anything, so they never tell classes apart (the ISA flags do)."""
    if "native-masked" not in mechanisms.values():
        return features
    return {h: {k: v for k, v in f.items() if k != "cpu"} for h, f in features.items()}


def _rank(feature: str) -> tuple:
    """Search and listing order: by _PRIORITY, ISA flags the kernel dispatch reads first (in its order)."""
    for i, p in enumerate(_PRIORITY):
        if feature.startswith(p):
            d = dispatch_rank(feature[4:]) if p == "isa:" else None
            return (i, len(DISPATCH) if d is None else d, feature)   # a flag it does not read: after them
    return (len(_PRIORITY), 0, feature)


def _values(features: dict, hosts: list) -> tuple[list, dict]:
    """(every feature in _rank order, host -> {feature: value}); an ISA flag a host lacks is False."""
    all_keys = sorted({k for h in hosts for k in features.get(h, {})}, key=_rank)
    return all_keys, {h: {k: features.get(h, {}).get(k, False if k.startswith("isa:") else None) for k in all_keys}
                      for h in hosts}


def _key(v) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def separating_features(features: dict, class_of: dict, max_size: int = 4, max_candidates: int = 60,
                        prefer=()):
    """The smallest feature set whose values differ between every two hosts of different classes.

    `features`: host -> {feature: value}; `class_of`: host -> class label; `prefer`: features tried
    first among sets of one size (the ones the kernels used, by qemu evidence).
    Returns [] for a single class, a list of feature names (in _rank order), or None when
    no set of at most `max_size` features separates them (e.g. two hosts with
    identical fingerprints in different classes).
    """
    hosts = list(class_of)
    if len(set(class_of.values())) <= 1:
        return []
    all_keys, value = _values(features, hosts)
    all_keys = [k for k in prefer if k in all_keys] + [k for k in all_keys if k not in prefer]
    varying = [k for k in all_keys if len({_key(value[h][k]) for h in hosts}) > 1]
    varying = varying[:max_candidates]
    pairs = [(a, b) for a, b in itertools.combinations(hosts, 2) if class_of[a] != class_of[b]]
    if not varying:
        return None
    # which pairs each feature separates, as a bitmask
    masks = {}
    for k in varying:
        m = 0
        for i, (a, b) in enumerate(pairs):
            if value[a][k] != value[b][k]:
                m |= 1 << i
        masks[k] = m
    full = (1 << len(pairs)) - 1
    for size in range(1, max_size + 1):
        for combo in itertools.combinations(varying, size):
            acc = 0
            for k in combo:
                acc |= masks[k]
            if acc == full:
                return sorted(combo, key=_rank)
    return None


def differing_features(features: dict, class_of: dict) -> list[str]:
    """Every feature with one value within each class and different values between classes, in _rank order
    (the ISA flags the kernel dispatch reads first). When the architecture differs, no ISA flag is listed:
    x86 and ARM flag names do not compare."""
    hosts = list(class_of)
    if len(set(class_of.values())) <= 1:
        return []
    all_keys, value = _values(features, hosts)
    out = []
    for k in all_keys:
        per_class: dict = {}
        for h in hosts:
            per_class.setdefault(class_of[h], set()).add(_key(value[h][k]))
        if all(len(v) == 1 for v in per_class.values()) and len(set.union(*per_class.values())) > 1:
            out.append(k)
    return [k for k in out if not k.startswith("isa:")] if "arch" in out else out


def _int8_only(feature: str) -> bool:
    return feature.startswith("isa:") and feature[4:] in INT8_ONLY


def _float_rank(feature: str) -> tuple:
    """_rank for a float variant: the flags only integer kernels read (tiers.INT8_ONLY) after every other feature."""
    return (_int8_only(feature), _rank(feature))


def separation(features: dict, class_of: dict, used: dict | None = None, float_only: bool = False) -> dict:
    """What tells the classes apart, as the report names it.

    `used`: host -> {ISA flag: [instruction families]} the host's kernels used (qemu evidence;
    tiers.used_features); `float_only`: the variant runs no integer kernel, so the int8-only flags
    (tiers.INT8_ONLY) come last and enter the smallest set only where nothing else separates. Returns {"smallest": the smallest separating set (None: none; []: one
    class), "features": the ISA flags the dispatch reads among the differing features and the
    smallest set (in the dispatch's order), then the rest of the smallest set, "others": how many
    other features differ, "kernels": [{"feature", "families", "hosts", "separates"}] for each flag
    the kernels used (separates: it is one of the differing features)}.
    """
    used = used or {}
    differ = differing_features(features, class_of)
    kernels: dict = {}
    for h in class_of:
        for flag, fams in sorted(used.get(h, {}).items()):
            k = f"isa:{flag}"
            entry = kernels.setdefault(k, {"feature": k, "families": set(), "hosts": [], "separates": k in differ})
            entry["families"].update(fams)
            entry["hosts"].append(h)
    prefer = sorted((k for k in kernels if k in differ), key=_rank)
    smallest = None
    if float_only:   # a float variant's kernels read no int8-only flag: a set without them, where one separates
        smallest = separating_features({h: {k: x for k, x in f.items() if not _int8_only(k)} for h, f in features.items()},
                                       class_of, prefer=prefer)
    if smallest is None:
        smallest = separating_features(features, class_of, prefer=prefer)
    dispatch = {k for k in [*differ, *(smallest or [])] if k in VECTOR_FEATURES
                or (k.startswith("isa:") and dispatch_rank(k[4:]) is not None)}
    shown = sorted(dispatch, key=_float_rank if float_only else _rank)
    shown += [k for k in smallest or [] if k not in shown]
    return {"smallest": smallest, "features": shown, "others": len([k for k in differ if k not in shown]),
            "kernels": [dict(e, families=sorted(e["families"]))
                        for _, e in sorted(kernels.items(), key=lambda kv: (not kv[1]["separates"], _rank(kv[0])))]}


def pair_features(features: dict, class_of: dict, a: str, b: str, float_only: bool = False) -> list[str]:
    """The features that tell class `a` from class `b`: no value a host of one has is a value a host of the other
    has (every host pair across the two differs in it), in _rank order; across architectures no ISA flag (x86 and
    ARM flag names do not compare); `float_only`: as for separation."""
    hosts = [h for h, c in class_of.items() if c in (a, b)]
    all_keys, value = _values(features, hosts)
    out = []
    for k in all_keys:
        va = {_key(value[h][k]) for h in hosts if class_of[h] == a}
        vb = {_key(value[h][k]) for h in hosts if class_of[h] == b}
        if not va & vb:
            out.append(k)
    out = sorted(out, key=_float_rank) if float_only else out
    return [k for k in out if not k.startswith("isa:")] if "arch" in out else out


def pair_separation(features: dict, class_of: dict, agreement: dict | None = None, used: dict | None = None,
                    float_only: bool = False) -> list[dict]:
    """Per pair of classes, what tells them apart, for a partition no single feature splits.

    `agreement`: (host a, host b) -> fixtures agreeing (fixture_agreement); `used`: host -> {ISA flag: [instruction
    families]} (qemu evidence). Each row: {"classes": [a, b], "hosts": their first hosts, "features": pair_features,
    "agree": fixtures agreeing between those hosts (None: not known), "evidence": {label: [families its hosts'
    kernels used]}, "kernels": {} (with_kernels fills it), "int8_path": {label: the U8S8 path its first host's
    features select} where the two differ (an integer variant only)}; ordered nearest first (most fixtures
    agreeing, then fewest features)."""
    first: dict = {}
    for h, c in class_of.items():
        first.setdefault(c, h)
    rows = []
    for a, b in itertools.combinations(list(first), 2):
        ha, hb = first[a], first[b]
        agree = (agreement or {}).get((ha, hb), (agreement or {}).get((hb, ha)))
        evidence = {c: sorted({f for h, x in class_of.items() if x == c for fams in (used or {}).get(h, {}).values()
                               for f in fams}) for c in (a, b)}
        paths = {} if float_only else {c: _int8_why(h, features.get(h, {})) for c, h in ((a, ha), (b, hb))}
        rows.append({"classes": [a, b], "hosts": [ha, hb], "features": pair_features(features, class_of, a, b, float_only),
                     "agree": agree, "evidence": {c: f for c, f in evidence.items() if f}, "kernels": {},
                     "int8_path": paths if len(set(paths.values())) > 1 else {}})
    return sorted(rows, key=lambda r: (-(r["agree"] if r["agree"] is not None else -1), len(r["features"])))


def _int8_why(host: str, feats: dict) -> str:
    """The U8S8 int8 path a host's architecture and ISA flags select (tiers.int8_path), in words."""
    return int8_path(host, feats.get("arch"), [k[4:] for k, v in feats.items() if k.startswith("isa:") and v]).why


def with_kernels(rows: list[dict], kernels: dict) -> list[dict]:
    """`rows` (pair_separation's) with each pair's kernels: {label: ["routine: kernel"]} for the routines whose
    kernel differs between the pair's first hosts (`kernels`: host -> {routine: kernel} onnxruntime's dispatch
    chose for the routines the variant's graph uses; a pair with a host it does not cover gets none)."""
    out = []
    for r in rows:
        (a, b), (ha, hb) = r["classes"], r["hosts"]
        ka, kb = kernels.get(ha), kernels.get(hb)
        differ = sorted(x for x in set(ka or {}) & set(kb or {}) if ka[x] != kb[x])
        out.append(dict(r, kernels={a: [f"{x}: {ka[x]}" for x in differ], b: [f"{x}: {kb[x]}" for x in differ]}
                        if differ else {}))
    return out


def needs_pairs(smallest, classes: int = 2) -> bool:
    """Whether a partition is worth a per-pair table: no single feature splits it (`smallest`, separation's), or
    only a last-resort fingerprint key does (`fp.`: e.g. how each CPU was obtained, real, masked or qemu, which
    tells three classes apart without saying which features changed their arithmetic) over `classes` >= 3."""
    if smallest is None or len(smallest) > 1:
        return True
    return classes >= 3 and bool(smallest) and smallest[0].startswith("fp.")


#: the features a runtime brings along with its onnxruntime version (its build, Python, numpy, C library)
_RUNTIME_FEATURES = ("ort_version", "fp.onnxruntime_build", "fp.python", "fp.numpy", "fp.libc")


def version_findings(features: dict, class_of: dict) -> list[dict]:
    """Pairs of hosts alike in every fingerprint feature but their runtime, with another onnxruntime version
    (e.g. pi4 and pi4@1.20.1): "separated by version" where their bytes differ (different classes), "no
    difference between versions" where they agree. `features`, `class_of`: as for separating_features."""
    out = []
    for a, b in itertools.combinations(list(class_of), 2):
        fa, fb = features.get(a, {}), features.get(b, {})
        if fa.get("ort_version") == fb.get("ort_version"):
            continue
        rest = {k for k in set(fa) | set(fb) if k not in _RUNTIME_FEATURES}
        if any(fa.get(k) != fb.get(k) for k in rest):
            continue
        same = class_of[a] == class_of[b]
        out.append({"hosts": [a, b], "versions": [fa.get("ort_version"), fb.get("ort_version")],
                    "finding": "no difference between versions" if same else "separated by version"})
    return out


def version_text(finding: dict) -> str:
    """'pi4 (onnxruntime 1.32.0) vs pi4@1.20.1 (1.20.1): no difference between versions'"""
    (a, b), (va, vb) = finding["hosts"], finding["versions"]
    return f"{a} (onnxruntime {va}) vs {b} ({vb}): {finding['finding']}"
