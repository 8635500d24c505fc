"""`quantbench commission --variant V --out DIR`: a commissioning kit a device runs to check itself."""

from __future__ import annotations

from quantbench.api.commission import DEFAULT_COUNT, commission
from quantbench.cli.groups import ResultsArgs

JSON_NATIVE = True  # prints its own --json summary
HELP = ("Write a commissioning kit of one variant after equiv ran it (model, fixtures, expected.json, check.py): a "
        "device with Python, numpy and onnxruntime runs check.py to learn which measured class it is in.")


RESULTS = ResultsArgs(what="the tables of the equiv analysis the kit is made from")


def add_arguments(parser) -> None:
    parser.add_argument("--variant", required=True, metavar="NAME",
                        help="the variant to commission, as equiv named it (MODEL/NAME when two models have one)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, metavar="N",
                        help=f"fixtures in the kit (default {DEFAULT_COUNT}): those that separated the classes and "
                             "those nearest the decision threshold")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the kit's folder: new or empty (written whole, then moved into place)")
    parser.add_argument("--force", action="store_true", help="replace an earlier kit in DIR (never another folder)")
    RESULTS.add(parser)


def run(args) -> int:
    kit = commission(args.variant, args.out, count=args.count, results=RESULTS.parse(args), force=args.force)
    if getattr(args, "json", False):
        import json

        print(json.dumps({"folder": str(kit.folder), "variant": kit.expected["variant"], "fixtures": kit.fixtures,
                          "classes": [{"label": c, "hosts": h} for c, h in kit.classes], "notes": kit.notes},
                         indent=2, sort_keys=True))
        return 0
    for note in kit.notes:
        print(f"note: {note}")
    classes = "; ".join(f"{c} ({', '.join(h)})" for c, h in kit.classes)
    decode = kit.expected["decode"]
    print(f"kit {kit.folder}/: variant {kit.expected['variant']['name']}, {kit.fixtures} fixtures, "
          f"{len(kit.classes)} measured class(es): {classes}; decisions "
          f"{'recorded' if decode else 'not recorded (no built-in simple decoder)'}")
    print(f"on a device: python3 {kit.folder}/check.py   (needs Python 3.8+, numpy and onnxruntime; exit 0 PASS, "
          "1 NEW CLASS, 2 a changed kit or missing runtime)")
    return 0
