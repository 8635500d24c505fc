"""Evaluating the tier predictor against measured classes (tests/analysis/test_predict.py and
scripts/bench_predict.py)."""

from __future__ import annotations

from quantbench.analysis import predict as PR


def leave_one_out(table: PR.DispatchTable, routines: dict, shown: dict[str, tuple[list, str]],
                  config: dict | None = None) -> list[dict]:
    """For each shown host: predicted from the others, against its measured class (mates = the other hosts in it)."""
    rows = []
    for h, (feats, cls) in sorted(shown.items()):
        others = {k: v for k, v in shown.items() if k != h}
        [p] = PR.predict(table, routines, others, {h: feats}, config)
        predicted = sorted(k for k, (_, c) in others.items() if p.joins is not None and c == p.joins)
        measured = sorted(k for k, (_, c) in others.items() if c == cls)
        rows.append({"host": h, "predicted": predicted, "measured": measured, "agree": predicted == measured,
                     "deciding": p.deciding})
    return rows
