"""The search's evaluation cache and its search id are keyed by everything that decides a flip count: the decoder
(its kind, every key of its decode block, a plug-in's SHA-256) and the fp32 reference besides the candidate, its
session, the host and the fixtures. A changed decoder is a miss: its flips are counted again, never the old
decoder's reused (a rerun passed the base as calibrated with a decoder's flips that never flipped)."""

from __future__ import annotations

import pytest

from quantbench.analysis.decode import spec_from_sidecar
from quantbench.cli import main
from quantbench.explain.search import SearchParams, search_id
from quantbench.explain.search.evaluator import CACHE_VERSION, decoder_key
from quantbench.fsutil import content_key
from quantbench.hosts.registry import HostRequest, HostSpec
from quantbench.inputs import plugins
from search_helpers import result_of
from setup_required import need_tier

SOFTMAX = {"kind": "classifier-softmax", "logits": "logits"}


def _spec(**block):
    return spec_from_sidecar({"decode": {**SOFTMAX, **block}})


def test_the_decoder_key_moves_with_every_decode_block_key_and_a_plug_ins_bytes(tmp_path, monkeypatch):
    assert decoder_key(_spec()) == decoder_key(_spec())
    keys = {decoder_key(_spec()), decoder_key(_spec(threshold=0.99)), decoder_key(_spec(threshold=0.5)),
            decoder_key(_spec(top_k=2))}
    assert len(keys) == 4
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dec.py").write_text("def decide(outputs, spec):\n    return {'cls': [0], 'score': [1.0]}\n")
    plugins.allow("dec.py:decide")
    plug = spec_from_sidecar({"decode": {"kind": "dec.py:decide"}})
    first = decoder_key(plug)
    (tmp_path / "dec.py").write_text("def decide(outputs, spec):\n    return {'cls': [1], 'score': [1.0]}\n")
    assert decoder_key(plug) != first


def test_the_search_id_and_the_cache_version_carry_the_decoder():
    hosts = [HostRequest("x86", HostSpec("x86", "local"), {})]
    params = SearchParams()
    assert CACHE_VERSION == "evaluation/3"
    old = content_key(["search/2", "b", "f", [(h.label, h.session) for h in hosts], ["f1"], params.key()])
    one = search_id("b", "f", hosts, ["f1"], params, decoder=decoder_key(_spec()))
    assert one != old and one != search_id("b", "f", hosts, ["f1"], params, decoder=decoder_key(_spec(top_k=2)))
    assert one != search_id("b", "f2", hosts, ["f1"], params, decoder=decoder_key(_spec()))


@pytest.mark.slow
def test_a_search_after_the_decoder_changed_counts_its_flips_again(run_dir, capsys):
    """The issue's probe: a decoder that never flips passes the base as calibrated on x86-avx2; the plain search
    after it must not reuse that evaluation (static-minmax flips 4 of 4 fixtures there with the sidecar's
    decoder)."""
    need_tier("x86-avx2")
    (run_dir / "constant.py").write_text("def decide(outputs, spec):\n"
                                         "    return {'cls': [0], 'score': [1.0], 'kept': [True]}\n")
    common = ["search", "--variant", "static-minmax", "--hosts", "x86-avx2", "--space", "global", "--no-progress"]
    assert main([*common, "--decode", "constant.py:decide"]) == 0
    first = result_of(capsys.readouterr().out)
    assert first["tried"][0]["choice"] == "base" and first["tried"][0]["passes"]
    main(common)
    out = capsys.readouterr().out
    again = result_of(out)
    assert again["search_id"] != first["search_id"]
    base = again["tried"][0]
    assert base["choice"] == "base" and not base["passes"] and base["worst"] == 4, out
    assert again["evaluations_run"] >= 1
