"""The body of a commissioning kit's check.py: a device checks itself against the classes equiv measured.

This module is copied verbatim into the kit's check.py (release/commission.py writes it), so it imports the
standard library only at its top (numpy and onnxruntime on first use: a device without them gets one line and
exit 2, not a traceback) and nothing of quantbench. The hashing, the session and the device's features are not
written here a second time: the kit carries the worker's own code (quantbench/tensorcode.py, quantbench/worker/)
and the built-in decoders' source (analysis/decode.py) as `SOURCES`, copied at build time from their owners.
`served` is the one decision summary: the kit's build computes the expected decisions with it too.

    python check.py [--json] [--model FILE]

prints one line, `PASS: identical to class A (pi, graviton2): 16 of 16 fixtures` (exit 0) or `NEW CLASS: matches
no measured class; ...` (exit 1); a kit file that does not match expected.json, a missing runtime or a run that
fails: `ERROR: ...` (exit 2). `--json` prints the same as one JSON object with the device's features.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys

EXPECTED = "expected.json"
#: set in the kit's copy: the SHA-256 of its expected.json, and the owners' sources
EXPECTED_SHA256 = ""
SOURCES: dict = {}
#: the worker's entry among SOURCES (the last of the worker's sources)
WORKER_ENTRY = "quantbench.worker.jobs"


class KitError(Exception):
    """A kit that does not match its expected.json, a missing runtime or a run that failed: exit 2."""


def served(decoded) -> dict:
    """The served decisions of one decoded fixture: [slot, class] of every kept decision, and for a map the
    SHA-256 of its thresholded mask (which pixels are served). The kit's build and check.py both call this."""
    import numpy as np

    kept = np.asarray(decoded.kept, dtype=bool)
    pairs = [[int(s), int(c)] for s, c, k in zip(decoded.slot.tolist(), decoded.cls.tolist(), kept.tolist()) if k]
    out = {"served": pairs}
    if decoded.mask is not None:
        mask = np.ascontiguousarray(np.asarray(decoded.mask, dtype=bool))
        h = hashlib.sha256(("%s|" % ",".join(str(int(d)) for d in mask.shape)).encode("ascii"))
        h.update(np.packbits(mask.ravel()).tobytes())
        out["mask_sha256"] = h.hexdigest()
    return out


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checked_file(kit: str, rel: str, want: str, what: str) -> str:
    """kit/rel, its SHA-256 checked against `want` (rel never leaves the kit unless it is the release's model)."""
    path = os.path.normpath(os.path.join(kit, rel))
    if not os.path.isfile(path):
        raise KitError("%s %s: missing" % (what, rel))
    got = _sha256_file(path)
    if got != want:
        raise KitError("%s %s: SHA-256 %s, expected.json says %s (the kit was changed)" % (what, rel, got[:16], want[:16]))
    return path


def load_kit(kit: str, model_file: "str | None" = None) -> dict:
    """expected.json checked against the hash check.py carries, and every file it names against its hash."""
    path = os.path.join(kit, EXPECTED)
    if not os.path.isfile(path):
        raise KitError("%s: missing" % EXPECTED)
    if EXPECTED_SHA256 and _sha256_file(path) != EXPECTED_SHA256:
        raise KitError("%s: its SHA-256 is not the one check.py was written with (the kit was changed)" % EXPECTED)
    with open(path, "rb") as fh:
        expected = json.loads(fh.read().decode("utf-8"))
    model = expected["model"]
    if model_file:
        expected["_model_path"] = _checked_file(os.getcwd(), model_file, model["sha256"], "model")
    elif not model["file"]:
        raise KitError("the kit names its model by SHA-256 %s alone (the release did not retain it): give check.py "
                       "the model file (see its help)" % model["sha256"][:16])
    else:
        expected["_model_path"] = _checked_file(kit, model["file"], model["sha256"], "model")
    for fx in expected["fixtures"]:
        fx["_path"] = _checked_file(kit, fx["file"], fx["sha256"], "fixture")
    return expected


def _namespace(name: str, extra: "dict | None" = None) -> dict:
    """One of the owners' sources the kit carries, run as a module namespace."""
    import types

    module = types.ModuleType("kit_" + name.replace(".", "_"))
    module.__dict__.update(extra or {})
    sys.modules[module.__name__] = module   # a dataclass among them looks its module up there
    exec(compile(SOURCES[name], name, "exec"), module.__dict__)
    return module.__dict__


def read_fixtures(expected: dict, tensorcode: dict) -> list:
    """[(index, input name, array)] of the kit's fixtures, each tensor's canonical hash checked against its id."""
    out = []
    for fx in expected["fixtures"]:
        with open(fx["_path"], "rb") as fh:
            arr = tensorcode["tensor_from_bytes"](fh.read(), fx["dtype"], fx["shape"])
        if tensorcode["tensor_sha256"](arr) != fx["fixture_id"]:
            raise KitError("fixture %s: its tensor is not fixture %s" % (fx["file"], fx["fixture_id"][:16]))
        out.append((fx["index"], fx["input_name"], arr))
    return out


def run_session(worker: dict, model: bytes, session: dict, fixtures: list) -> list:
    """[(output hashes {name: sha256}, outputs {name: array})] per fixture, under the recorded `session`
    (built by the worker's own make_session, batch 1)."""
    try:
        sess = worker["make_session"](model, worker["normalize_session"](session))[0]
        names = [o.name for o in sess.get_outputs()]
        out = []
        for _, input_name, arr in fixtures:
            arrays = dict(zip(names, sess.run(names, {input_name: arr})))
            out.append(({n: worker["tensor_sha256"](a) for n, a in arrays.items()}, arrays))
        return out
    except Exception as exc:
        raise KitError("the model did not run under session %s: %s: %s" % (
            json.dumps(session, sort_keys=True), type(exc).__name__, exc)) from None


def decisions_of(expected: dict, runs: list) -> "list | None":
    """The served decisions per fixture of one run (None: the kit's decoder is not a built-in simple rule)."""
    decode = expected.get("decode")
    if not decode:
        return None
    ns = _namespace("decode.py")
    spec = ns["Spec"](**decode["spec"])
    return [served(ns[decode["decoder"]](spec, arrays)) for _, arrays in runs]


def compare(expected: dict, runs_by_session: dict) -> dict:
    """The verdict: the first class (label order) whose hashes this device reproduces on every fixture under one
    of its hosts' sessions, else the class it agrees with on most fixtures (ties: label order)."""
    n = len(expected["fixtures"])
    best = None
    for cls in expected["classes"]:
        for key in sorted({json.dumps(h["session"], sort_keys=True) for h in cls["hosts"]}):
            got = [hashes for hashes, _ in runs_by_session[key]]
            same = [g == w for g, w in zip(got, cls["outputs"])]
            if all(same):
                return {"result": "PASS", "class": cls["label"], "hosts": [h["host"] for h in cls["hosts"]],
                        "fixtures": n, "identical": n, "session": key}
            score = (sum(same), -expected["classes"].index(cls))
            if best is None or score > best[0]:
                best = (score, cls, key, same)
    _, cls, key, same = best
    first = next(fx["index"] for fx, ok in zip(expected["fixtures"], same) if not ok)
    return {"result": "NEW CLASS", "class": cls["label"], "hosts": [h["host"] for h in cls["hosts"]],
            "fixtures": n, "identical": sum(same), "first_differs": first, "session": key}


def decision_diff(expected: dict, verdict: dict, runs_by_session: dict) -> "int | None":
    """Fixtures whose served decisions differ from the nearest class's recorded ones (None: none recorded)."""
    cls = next(c for c in expected["classes"] if c["label"] == verdict["class"])
    if cls.get("decisions") is None:
        return None
    mine = decisions_of(expected, runs_by_session[verdict["session"]])
    return sum(a != b for a, b in zip(mine, cls["decisions"]))


def sve_vector_length() -> "int | None":
    """The SVE vector length in bits this process runs with (prctl PR_SVE_GET_VL), None without SVE."""
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return None
    try:
        import ctypes

        vl = ctypes.CDLL(None, use_errno=True).prctl(51, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return None
    return None if vl < 0 else (vl & 0xFFFF) * 8


def device_features(worker: dict) -> dict:
    """What this device is, as the worker's fingerprint reads it: arch, CPU flags, SVE length, runtime."""
    try:
        ident = worker["collect_fingerprint"]()["identity"]
    except Exception as exc:
        ident = {"arch": platform.machine(), "error": "%s: %s" % (type(exc).__name__, exc)}
    ort = ident.get("onnxruntime") or {}
    return {"arch": ident.get("arch"), "cpu_flags": ident.get("isa_flags", []), "sve_vector_length": sve_vector_length(),
            "cpu_mechanism": ident.get("cpu_mechanism"), "onnxruntime": ort.get("version"),
            "numpy": ident.get("numpy"), "python": ident.get("python"), "error": ident.get("error")}


def verdict_line(v: dict) -> str:
    if v["result"] == "PASS":
        return "PASS: identical to class %s (%s): %d of %d fixtures" % (
            v["class"], ", ".join(v["hosts"]), v["identical"], v["fixtures"])
    dec = ("decisions: not recorded (the decoder is not a built-in simple rule)" if v["decisions_differ"] is None
           else "decisions: %d of %d fixtures differ from class %s" % (v["decisions_differ"], v["fixtures"], v["class"]))
    return "NEW CLASS: matches no measured class; first differs on fixture %d; %s" % (v["first_differs"], dec)


def check(kit: str, model_file: "str | None" = None) -> dict:
    """The whole check: the kit's files, then its fixtures under each recorded session, then the verdict."""
    try:
        import numpy  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise KitError("missing runtime: %s (the kit needs Python 3.8+, numpy and onnxruntime)" % exc) from None
    expected = load_kit(kit, model_file)
    # the worker's entry, run with its sources (SOURCES keeps their load order) installed as their modules
    worker = _namespace(WORKER_ENTRY, {"_SOURCES": [(name, text.encode("utf-8")) for name, text in SOURCES.items()
                                                    if name.startswith("quantbench.") and name != WORKER_ENTRY]})
    tensorcode = worker
    fixtures = read_fixtures(expected, tensorcode)
    with open(expected["_model_path"], "rb") as fh:
        model = fh.read()
    sessions = {json.dumps(h["session"], sort_keys=True) for c in expected["classes"] for h in c["hosts"]}
    runs = {key: run_session(worker, model, json.loads(key), fixtures) for key in sorted(sessions)}
    verdict = compare(expected, runs)
    verdict["decisions_differ"] = None if verdict["result"] == "PASS" else decision_diff(expected, verdict, runs)
    verdict["variant"] = expected["variant"]["name"]
    verdict["device"] = device_features(worker)
    return verdict


def main(argv: "list | None" = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Check this device against the classes quantbench measured.")
    parser.add_argument("--json", action="store_true", help="print the verdict and the device's features as JSON")
    parser.add_argument("--model", default=None, help="the variant's model file, when the kit refers to it by hash")
    args = parser.parse_args(argv)
    kit = os.path.dirname(os.path.abspath(__file__))
    try:
        verdict = check(kit, args.model)
    except KitError as exc:
        if args.json:
            print(json.dumps({"result": "ERROR", "error": str(exc)}, sort_keys=True))
        else:
            print("ERROR: %s" % exc)
        return 2
    verdict.pop("session", None)
    print(json.dumps(verdict, sort_keys=True) if args.json else verdict_line(verdict))
    return 0 if verdict["result"] == "PASS" else 1
