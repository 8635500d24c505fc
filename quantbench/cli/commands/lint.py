"""`quantbench lint MODEL`: static saturation lint of an int8 model's weights, per layer and host tier."""

from __future__ import annotations


from quantbench.store import partwrite
from quantbench.cli.groups import FleetArgs, ResultsArgs
from quantbench.explain import update_report
from quantbench.explain.lint import fleet_note, fleet_of, lint_model
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.cli.runplan import fleet_requests
from quantbench.textfmt import text_table

HELP = "Lint an int8 model's weights for x86 vpmaddubsw saturation, NEON int16 wrap and int32 overflow, per layer."


FLEET = FleetArgs(fingerprints=True)
RESULTS = ResultsArgs(tables_alias=True)


def add_arguments(p) -> None:
    p.add_argument("model", help="a quantized ONNX model (static QDQ, or QLinear/MatMulInteger/ConvInteger ops)")
    p.add_argument("--all", action="store_true", help="list every int8 layer, not only the ones some tier can diverge on")
    RESULTS.add(p)
    FLEET.add(p)


def run(args) -> int:
    model = load_model(args.model)
    requests = fleet_requests(FLEET.parse(args))
    fleet = fleet_of(requests) if requests else None
    rows = lint_model(model, fleet)
    vid = semantic_sha256(model)
    results = RESULTS.parse(args)
    root = results.tables
    part = partwrite.append("lint", [dict(r.row(), variant_id=vid, model=str(args.model)) for r in rows], root=root)
    risky = [r for r in rows if r.tiers]
    shown = rows if args.all else risky
    head = ("layer", "op", "K", "act/weight", "x86 sat pairs", "neon wrap pairs", "int32", "tiers")
    head += ("fleet hosts affected",) if fleet else ()
    out = [head] + [(r.node, r.op_type, str(r.k), f"{r.act_type}/{r.weight_type}", str(r.x86_saturating_pairs),
                     str(r.neon_wrapping_pairs), "ok" if r.int32_ok else "OVERFLOW", ",".join(r.tiers) or "-")
                    + ((",".join(r.fleet_hosts) or "-",) if fleet else ())
                    for r in shown]
    if shown:
        print(text_table(out[0], out[1:]))
    for r in risky:
        print(f"{r.node}: {r.reason}")
    if fleet:
        print(fleet_note(fleet, rows))
    print(f"{len(rows)} int8 weight tensor(s), {len(risky)} that some host tier can diverge on"
          + (f"; lint table: {part.parent}" if part else ""))

    print(f"report: {update_report(results.folder, root)}")
    return 0
