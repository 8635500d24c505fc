"""`quantbench diff A.onnx B.onnx`: what differs between two ONNX files, ranked by semantic risk."""

from __future__ import annotations

from quantbench.errors import GateFailed
from quantbench.inputs.modelio import parse_strip
from quantbench.release.diff import SEMANTIC, diff_models, format_diff

HELP = ("Compare two ONNX files: op types, initializers, interface, opset, producer, value_info and "
        "doc_strings, ranked by semantic risk (not by bytes), with raw and semantic hashes of both.")


def add_arguments(parser) -> None:
    parser.add_argument("a", metavar="A.onnx", help="first model")
    parser.add_argument("b", metavar="B.onnx", help="second model")
    parser.add_argument("--strip", default="",
                        help="extra non-executing content left out of the semantic hash, comma-separated: "
                             "producer, value_info, metadata (doc_strings are always left out)")
    parser.add_argument("--json", action="store_true", help="print the full comparison as JSON instead of a table")
    parser.add_argument("--gate", action="store_true",
                        help="exit 1 when any semantic difference (op, initializer, interface, opset, node) is found")


def run(args) -> int:
    import json

    d = diff_models(args.a, args.b, parse_strip(args.strip))
    if args.json:
        print(json.dumps(d.to_json(), indent=2, sort_keys=True))
    else:
        print(format_diff(d))
    n = sum(f.differs and f.risk == SEMANTIC for f in d.findings)
    if args.gate and n:
        raise GateFailed(f"{n} semantic difference(s) between {args.a} and {args.b}")
    return 0
