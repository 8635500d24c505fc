"""The identity walk's "quantized outputs" step (searchidentity.QUANTIZED_OUTPUTS): a candidate with its float graph
outputs put through Q/DQ at their calibrated ranges is written with a recipe saying so, and a search started from
that variant re-makes it byte-identically (the search refuses a base its recipe does not re-make)."""

from __future__ import annotations

import json

from explain_helpers import bright_corpus, softmax_sigmoid_image_model
from quantbench.cli import main


def _calibrated(workdir):
    model = softmax_sigmoid_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(workdir / "corpus", count=6)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--no-progress"]) == 0


def test_a_variant_with_quantized_outputs_is_re_made_from_its_recipe(workdir):
    from quantbench.explain.searchidentity import QUANTIZED_OUTPUTS, stacked
    from quantbench.explain.searchspace import Space
    from quantbench.inputs.variantdir import Variant, latest_variants

    _calibrated(workdir)
    base = next(v for v in latest_variants() if v.name == "static-minmax")
    space = Space.open(base, workdir / "s1")
    soft, soft_q = stacked(space.base_choice(), "Softmax", space)   # Softmax kept float, then its output quantized
    assert soft_q.name == f"float_softmax+{QUANTIZED_OUTPUTS}" and soft_q.quantize_outputs
    assert space.build(soft_q, ()).variant_id != space.build(soft, ()).variant_id   # the pair is in the graph
    folder = base.path.parent
    built = space.write(soft_q, (), folder / "qo.onnx", "qo", {})
    recipe = json.loads((folder / "qo.recipe.json").read_text())
    assert recipe["quantize_outputs"] is True and recipe["exclude_op_types"] == ["Softmax"]
    assert recipe["semantic_sha256"] == built.variant_id
    again = Space.open(Variant(name="qo", path=folder / "qo.onnx", model=base.model, recipe=recipe), workdir / "s2")
    assert again.base_choice().quantize_outputs   # and Space.open checked the re-made base is the variant written
    assert again.build(again.base_choice(), ()).variant_id == built.variant_id
