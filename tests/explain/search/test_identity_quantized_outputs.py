"""The identity walk's "quantized outputs" step (search.identity.QUANTIZED_OUTPUTS): a candidate with its float graph
outputs put through Q/DQ at their calibrated ranges is written with a recipe saying so, and a search started from
that variant re-makes it byte-identically (the search refuses a base its recipe does not re-make). On the x86 tiers
a float Softmax at the end differs in its last bits between MLAS's AVX2/FMA and SSE kernels; on its int8 grid the
outputs are one class."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from explain_helpers import softmax_sigmoid_image_model
from search_helpers import calibrate_small
from setup_required import need_tier


def test_a_variant_with_quantized_outputs_is_re_made_from_its_recipe(workdir):
    from quantbench.explain.search.identity import QUANTIZED_OUTPUTS, stacked
    from quantbench.explain.search.space import Space
    from quantbench.inputs.variantdir import Variant, latest_variants

    calibrate_small(workdir, softmax_sigmoid_image_model)
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


def _write(space, base, choice, name):
    """`choice` written into the variants folder as the search writes its answer (its index, the base's labels)."""
    from quantbench.explain.search import MADE_BY_STATIC
    from quantbench.explain.search.write import write_variant

    keep = {k: v for k, v in base.recipe.items() if k not in MADE_BY_STATIC}
    return write_variant(space, choice, (), space.build(choice, ()).variant_id, name, {**keep, "search": {}})


def _classes_in_a_fresh_equiv(cwd, hosts, folder, names) -> dict:
    """{variant: its classes' hosts} a fresh `equiv` (its own run, results/equiv.json) finds beside the fp32."""
    proc = subprocess.run([sys.executable, "-m", "quantbench", "equiv", "--hosts", hosts, "--variants",
                           str(folder / "fp32.onnx"), *(str(folder / f"{n}.onnx") for n in names), "--no-progress"],
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads((cwd / "results/equiv.json").read_text())
    return {v["variant"]: [c["hosts"] for c in v["classes"]] for v in found["variants"]}


@pytest.mark.slow
def test_quantized_outputs_put_a_float_softmax_tail_of_two_x86_tiers_in_one_class(workdir):
    """reduce_range makes the int8 part exact on both tiers; the Softmax kept in float then separates them (AVX2 and
    FMA here, read from this CPU's features: MLAS's exp kernels differ from the SSE ones in the last bits); with its
    output quantized they are one class."""
    from quantbench.explain.search.identity import _step, stacked
    from quantbench.explain.search.space import Space
    from quantbench.hosts.masked import here_features
    from quantbench.inputs.variantdir import latest_variants

    need_tier("x86-sse4")
    if not {"avx2", "fma"} <= set(here_features()):
        pytest.skip("this CPU has no AVX2+FMA: x86 runs the same float kernels as x86-sse4 (a fact about the CPU)")
    calibrate_small(workdir, softmax_sigmoid_image_model)
    base = next(v for v in latest_variants() if v.name == "static-minmax")
    space = Space.open(base, workdir / "s1")
    exact = _step(space.base_choice(), "reduce_range", reduce_range=True)
    soft, soft_q = stacked(exact, "Softmax", space)
    _write(space, base, soft, "soft")
    _write(space, base, soft_q, "soft_q")
    classes = _classes_in_a_fresh_equiv(workdir, "x86,x86-sse4", base.path.parent, ["soft", "soft_q"])
    assert classes["soft"] == [["x86"], ["x86-sse4"]]
    assert classes["soft_q"] == [["x86", "x86-sse4"]]
