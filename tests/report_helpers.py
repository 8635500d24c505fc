"""Hand-made equiv results and accuracy inputs (EquivResult-shaped data, truths, decoded slots) for the
report and accuracy tests: no model, no run."""

import math

import numpy as np

from quantbench.analysis.accuracy import FixtureTruth, Truth
from quantbench.analysis.decode import Decoded
from quantbench.analysis.equiv import EquivResult


def _cls(label, hosts, digest):
    return {"label": label, "hosts": hosts, "digest": digest}


def _variant(name, vid, classes, kind="classifier-softmax", threshold=None):
    return {"variant": name, "variant_id": vid, "model": "m", "fixtures": 10, "classes": classes,
            "agreement": [], "separating_features": [], "distances": [], "feature_values": {},
            "decode": {"kind": kind, "threshold": threshold, "classes": ["a", "b"], "outputs": {}}}


def _comp(kind, host, variant, vid, ref_host, ref_variant, flips, images, compared=True):
    return {"comparison": kind, "host": host, "variant": variant, "variant_id": vid, "model": "m",
            "ref_host": ref_host, "ref_variant": ref_variant, "fixtures": 10, "ref_total": 10, "total": 10,
            "flips": flips if compared else None, "images_disagree": images if compared else None,
            "by_kind": {"threshold": 0, "class": flips, "box-shift": 0}, "concealed": bool(flips),
            "margins": {}, "tensor_gate": {"passed": flips == 0, "failing": flips, "elements": 20, "max_abs": 0.1},
            "decision_passed": (flips == 0) if compared else None, "gates_disagree": "",
            "decisions_compared": compared}


def _flip(kind, host, variant, vid, fixture, margin, ref_host="x86", ref_variant="fp32", score=0.4):
    return {"equiv_id": "e", "comparison": kind, "host": host, "variant_id": vid, "variant": variant,
            "ref_host": ref_host, "ref_variant": ref_variant, "fixture_id": fixture, "source": f"{fixture}.png",
            "ref_slot": 0, "slot": 0, "kind": "class", "ref_class": "a", "class_name": "b", "ref_score": 0.5,
            "score": score, "iou": math.nan, "threshold": None, "margin": margin,
            "band": "[0,0.01)" if abs(margin) < 0.01 else "[0.01,0.02)"}


def hand_result(decode_none=False, duplicates=None) -> EquivResult:
    """fp32 and dynamic on x86 (reference) and pi, one class each; static-entropy's outputs equal dynamic's."""
    hosts = {h: {"kind": "local", "arch": "x86_64", "cpu": "c", "ort_version": "1", "fingerprint_id": h * 8}
             for h in ("x86", "pi")}
    kind = "none" if decode_none else "classifier-softmax"
    variants = [_variant("fp32", "v0", [_cls("A", ["x86", "pi"], "d0")], kind),
                _variant("dynamic", "v1", [_cls("A", ["x86", "pi"], "d1")], kind),
                _variant("static-entropy", "v2", [_cls("A", ["x86", "pi"], "d1")], kind)]
    c = not decode_none
    comps = [_comp("ref-fp32", "pi", "fp32", "v0", "x86", "fp32", 0, 0, c)]
    for name, vid in (("dynamic", "v1"), ("static-entropy", "v2")):
        comps += [_comp("own-fp32", "x86", name, vid, "x86", "fp32", 3, 2, c),
                  _comp("own-fp32", "pi", name, vid, "pi", "fp32", 3, 2, c),
                  _comp("ref-fp32", "pi", name, vid, "x86", "fp32", 3, 2, c),
                  _comp("ref-same", "pi", name, vid, "x86", name, 0, 0, c)]
    flips = []
    if c:
        for name, vid in (("dynamic", "v1"), ("static-entropy", "v2")):
            for kind_, host in (("own-fp32", "x86"), ("own-fp32", "pi"), ("ref-fp32", "pi")):
                rh = "x86" if kind_ == "ref-fp32" else host
                flips += [_flip(kind_, host, name, vid, "f1", 0.004, rh), _flip(kind_, host, name, vid, "f1", -0.015, rh, score=0.3),
                          _flip(kind_, host, name, vid, "f2", 0.002, rh)]
    settings = {"hosts": list(hosts), "reference": "x86", "atol": 1e-5, "rtol": 1e-5, "budget": 0,
                "fixtures": {"v0": ["f1", "f2"], "v1": ["f1", "f2"], "v2": ["f1", "f2"]}}
    if duplicates:
        settings["duplicates"] = duplicates
    return EquivResult(equiv_id="e" * 64, settings=settings, hosts=hosts, variants=variants, comparisons=comps,
                       flip_rows=flips)


def _truth(annotations: dict, size=(100, 200), categories=None, preprocess=None):
    pre = preprocess or {"shape": [1, 3, 50, 100], "layout": "NCHW", "resize": "stretch"}
    fx = {f: FixtureTruth(fixture_id=f, source=f"{f}.png", image_sha256="", annotations=a, stratum="",
                          split="eval", preprocess=pre, size=size) for f, a in annotations.items()}
    return Truth(fixtures=fx, categories=categories)


def _dec(cls, score=None, box=None):
    cls = np.asarray(cls, np.int64)
    score = np.full(cls.size, 0.9) if score is None else np.asarray(score, np.float64)
    return Decoded(slot=np.arange(cls.size), cls=cls, score=score, kept=np.ones(cls.size, bool),
                   margin=score - 0.5, box=None if box is None else np.asarray(box, np.float64))
