"""`quantbench lint MODEL`: static saturation lint of an int8 model's weights, per layer and host tier."""

from __future__ import annotations

from quantbench.api.lint import lint
from quantbench.cli.groups import FleetArgs, ResultsArgs

HELP = "Lint an int8 model's weights for x86 vpmaddubsw saturation, NEON int16 wrap and int32 overflow, per layer."


FLEET = FleetArgs(fingerprints=True)
RESULTS = ResultsArgs(tables_alias=True)


def add_arguments(p) -> None:
    p.add_argument("model", help="a quantized ONNX model (static QDQ, or QLinear/MatMulInteger/ConvInteger ops)")
    p.add_argument("--all", action="store_true", help="list every int8 layer, not only the ones some tier can diverge on")
    RESULTS.add(p)
    FLEET.add(p)


def run(args) -> int:
    done = lint(args.model, FLEET.parse(args), RESULTS.parse(args))
    listing = done.listing(every=args.all)
    if listing:
        print(listing)
    for r in done.risky:
        print(f"{r.node}: {r.reason}")
    if done.fleet:
        print(done.fleet_note())
    print(f"{len(done.layers)} int8 weight tensor(s), {len(done.risky)} that some host tier can diverge on"
          + (f"; lint table: {done.part.parent}" if done.part else ""))
    print(f"report: {done.report}")
    return 0
