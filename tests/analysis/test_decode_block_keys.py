"""A sidecar decode block holds only its kind's keys: a typo (`"thresold"`) is refused, naming the nearest key, before
anything runs; it used to leave the threshold at its default without a word."""

from __future__ import annotations

import json

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.analysis.decode import KINDS, kind_of, spec_from_sidecar
from quantbench.cli import main
from quantbench.errors import UserError


@pytest.mark.parametrize("block, message", [
    ({"kind": "classifier-softmax", "thresold": 0.5}, "decode 'thresold': not a key of a classifier-softmax decode "
                                                      "block; did you mean 'threshold'?"),
    ({"kind": "detr-sigmoid", "top-k": 5}, "did you mean 'top_k'?"),
    ({"kind": "yolo", "strides": [8, 16]}, "decode 'strides': not a key of a yolo decode block (keys: kind,"),
    ({"kind": "ctc", "blanc": 0}, "did you mean 'blank'?"),
])
def test_a_key_the_kind_does_not_have_is_refused(block, message):
    with pytest.raises(UserError) as err:
        spec_from_sidecar({"decode": block}, source="m.json")
    assert str(err.value).startswith("m.json: ") and message in str(err.value)


def test_every_key_a_kind_reads_is_accepted():
    """Each kind's block with every key it documents parses (no key it reads is refused as unknown)."""
    values = {"threshold": 0.5, "top_k": 3, "box_format": "xyxy", "box_frame": "normalized", "iou": 0.5,
              "max_det": 10, "pre_threshold": 0.1, "layout": None, "objectness": True, "strides": [8],
              "input_size": [8, 8], "blank": 0, "alphabet": ["a"], "alphabet_file": {"file": "a", "sha256": "0"},
              "space": False}
    for name in KINDS:
        k = kind_of(name)
        block = {key: values.get(key, f"out_{key}") for key in k.block_keys() if key != "kind"}
        spec_from_sidecar({"decode": {"kind": name, **block}}, source="m.json")


def test_a_block_for_another_kind_is_not_checked_against_the_asked_one():
    spec_from_sidecar({"decode": {"kind": "yolo", "iou": 0.5}}, kind="classifier-softmax")
    spec_from_sidecar({"decode": {"kind": "mod.py:fn", "cut": 0.5}}, kind="none")


def test_equiv_refuses_a_misspelt_decode_key_before_anything_is_written(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    model.with_suffix(".json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "thresold": 0.5}}))
    corpus = make_corpus(workdir / "corpus")
    before = digest(workdir)
    rc = main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(corpus), "--no-progress"])
    line = one_line(capsys.readouterr().err, "equiv")
    assert rc == 2 and line.endswith("m.json: decode 'thresold': not a key of a classifier-softmax decode block; "
                                     "did you mean 'threshold'?"), line
    assert digest(workdir) == before
