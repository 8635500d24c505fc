"""`quantbench diff A.onnx B.onnx`: what differs between two ONNX files, ranked by semantic risk."""

from __future__ import annotations

from quantbench.api.diff import diff

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

    done = diff(args.a, args.b, args.strip)
    if args.json:
        print(json.dumps(done.to_json(), indent=2, sort_keys=True))
    else:
        print(done.text())
    if args.gate:
        done.check()
    return 0
