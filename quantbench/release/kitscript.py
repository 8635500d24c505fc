"""A commissioning kit's check.py, generated from the code that owns each part of it (no second copy by hand).

check.py is release/kitcheck.py (the check itself) with the SHA-256 of the kit's expected.json set in it, followed
by the sources it runs, copied from their owners at build time: quantbench/tensorcode.py and quantbench/worker/ (the
hashing, the session and the fingerprint every host runs), and the built-in simple decoders of analysis/decode.py
(classifier argmax, sigmoid threshold, threshold map) with the few lines they need to run outside quantbench.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from quantbench import __version__
from quantbench.analysis import decode
from quantbench.hosts.process import worker_source
from quantbench.release import kitcheck

#: the decoders a kit can re-apply on a device: built-in rules on the outputs alone (no plug-in, no NMS)
SIMPLE_DECODERS = (decode.decode_classifier, decode.decode_detr, decode.decode_map)
_DECODE_HELPERS = (decode.Decoded, decode._squeeze_batch, decode._sigmoid, decode.cxcywh_to_xyxy,
                   decode.label_regions)

# What the copied decoders take from quantbench: a spec with DecodeSpec.as_dict()'s fields, ParameterError.
_DECODE_PRELUDE = '''from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class ParameterError(ValueError):
    def __init__(self, param, problem, value=None):
        super().__init__("%s: %s" % (param, problem))


class Spec:
    def __init__(self, kind, outputs, threshold=None, top_k=None, classes=(), box_format="xyxy"):
        self.kind, self.outputs, self.threshold, self.top_k = kind, dict(outputs), threshold, top_k
        self.classes, self.box_format = list(classes), box_format
'''

_SHA_LINE = 'EXPECTED_SHA256 = ""'


def simple_decoder(spec) -> str | None:
    """The name of the spec's decoder when the kit can re-apply it on a device (None: it cannot)."""
    if spec is None:
        return None
    fn = spec.decoder_kind.decoder
    return fn.__name__ if fn in SIMPLE_DECODERS else None


def decode_source() -> str:
    """The built-in simple decoders and their helpers, as one module's source."""
    parts = [_DECODE_PRELUDE] + [inspect.getsource(obj) for obj in (*_DECODE_HELPERS, *SIMPLE_DECODERS)]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def sources() -> dict:
    """{file name: source} of what check.py runs besides itself."""
    out = {module: src.decode("utf-8") for module, src in worker_source()}   # the worker's, in load order
    out["decode.py"] = decode_source()
    return out


def render(expected_sha256: str) -> str:
    """check.py's text for a kit whose expected.json has this SHA-256 (same inputs, same text)."""
    body = Path(kitcheck.__file__).read_text(encoding="utf-8")
    if body.count(_SHA_LINE) != 1:
        raise RuntimeError(f"{kitcheck.__file__}: expected one line {_SHA_LINE!r}")
    body = body.replace(_SHA_LINE, f'EXPECTED_SHA256 = "{expected_sha256}"')
    lines = ["#!/usr/bin/env python3",
             f"# check.py of a quantbench {__version__} commissioning kit: generated, do not edit (expected.json's",
             "# hash is in it; the sources at its end are quantbench's own, copied when the kit was written).",
             body.rstrip("\n"), "", "", "SOURCES.update({"]
    lines += [f"    {name!r}: {text!r}," for name, text in sources().items()]   # the worker's load order
    lines += ["})", "", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""]
    return "\n".join(lines)
