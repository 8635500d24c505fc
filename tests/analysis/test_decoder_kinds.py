"""Decoder-kind policy has one owner: the kind objects of quantbench.analysis.decode (kind_of). Nothing
else decides by a kind's name: no comparison with a kind name, no table keyed by kind names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from quantbench.analysis import accuracy, decisions
from quantbench.analysis.decode import KINDS, NONE, kind_of

ROOT = Path(__file__).resolve().parents[2] / "quantbench"
OWNER = ROOT / "analysis" / "decode.py"
NAMES = set(KINDS) | {NONE}


def _names_a_kind(node: ast.AST) -> bool:
    """A kind name literal, the NONE constant, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Name):
        return node.id == "NONE"
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e) for e in node.elts)
    return False


def _lists_kinds(items) -> bool:
    return any(isinstance(k, ast.Constant) and k.value in KINDS for k in items)


def kind_name_decisions(path: Path) -> list[int]:
    """The lines of each comparison with a kind name, each dict keyed by kind names and each collection of
    kind names (a second registry: MATCHED_KINDS = ("nms-boxes", "yolo"))."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(map(_names_a_kind, [node.left, *node.comparators])):
            found.add(node.lineno)
        elif isinstance(node, ast.Dict) and _lists_kinds(node.keys):
            found.add(node.lineno)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and _lists_kinds(node.elts):
            found.add(node.lineno)
    return sorted(found)


def test_no_module_but_the_kinds_owner_decides_by_kind_name():
    hits = [f"{p.relative_to(ROOT.parent)}:{line}" for p in sorted(ROOT.rglob("*.py")) if p != OWNER
            for line in kind_name_decisions(p)]
    assert hits == []


def test_the_check_sees_a_kind_name_comparison(tmp_path):
    """The scan above is not vacuous: each way of deciding by a kind's name is found."""
    src = tmp_path / "m.py"
    src.write_text('if spec.kind == "ctc":\n    pass\nx = kind in ("yolo", "yolox")\ny = k != NONE\n'
                   'FRAMES = {"yolo": "input-pixels"}\nz = a == "threshold"\nBOXED = ["nms-boxes", "detr-sigmoid"]\n'
                   'EMPTY = ("none", "empty")\n')
    assert kind_name_decisions(src) == [1, 3, 4, 5, 7]


@pytest.mark.parametrize("name", [*KINDS, NONE, "my_decoders:decode"])
def test_every_kind_names_a_comparison_and_a_plan_that_exist(name):
    kind = kind_of(name)
    assert kind.name == name
    assert kind.compare in decisions.COMPARERS
    assert kind.metric is None or kind.metric in accuracy.PLANS
    assert (kind.metric is None) == bool(kind.unscored)
    assert kind.decides == (name != NONE)


def test_an_unknown_kind_name_is_refused():
    with pytest.raises(ValueError, match="unknown decode kind 'yolov99'"):
        kind_of("yolov99")
