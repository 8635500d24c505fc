"""The ARM claim on the cores models ship to now, measured: static QDQ is one class across every ARM host, fp32 and
dynamic int8 split by the SVE vector length and SME (not by the core's name), and each new host's bytes are plain
onnxruntime's under qemu-user with the same CPU model, vector lengths and threads (no quantbench code in that run).

The demo detector (fp32, dynamic, static-minmax as `quantbench calibrate` makes them), 2 fixtures, 1 intra-op
thread (the thread count is its own axis on aarch64 fp32; the equivalence by vector length is what is stated here):
the session's measured ARM run (tests/fleet_helpers.arm_demo_equiv), read back through run_hosts.
Needs `quantbench hosts setup pi graviton3 graviton4 orin phone-sme2 docker-arm64` (scripts/setup.sh --for-tests).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import real_models as R
from quantbench.hosts import emulated as E
from quantbench.hosts.registry import make_host, resolve_hosts
from quantbench.store import partread
from setup_required import missing_setup

FLEET = ("pi", "graviton3", "graviton4", "orin", "phone-sme2", "docker-arm64")
NEW = ("graviton4", "orin", "phone-sme2", "docker-arm64")
#: qemu CPUs with graviton4's features (SVE2 at 128 bits, i8mm, bf16, no SME) under other names: the stand-in rule
SAME_FEATURES_AS_GRAVITON4 = ("cortex-a710", "max,sme=off,sve-default-vector-length=16")


def _variants(folder: Path):
    """The demo detector's fp32, dynamic and static-minmax variants in `folder` (made by `quantbench calibrate`)."""
    from quantbench.inputs.variantdir import Variant

    return [Variant(name=n, path=folder / f"{n}.onnx", model="litter-detr-tiny", recipe={"variant": n})
            for n in ("fp32", "dynamic", "static-minmax")]


def _fixtures(count: int):
    from quantbench.inputs import assets, sidecarfile
    from quantbench.inputs.fixtures import build_fixtures
    from quantbench.inputs.modelio import load_model
    from quantbench.inputs.preprocess import input_spec

    model = assets.demo_model()
    first = load_model(model).graph.input[0]
    shape = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
    spec = input_spec(sidecarfile.load_sidecar(model), shape, first.name)
    return build_fixtures(spec, split="eval", limit=count)


def _independent(workdir: Path, variants, fixtures) -> dict:
    """{(host or qemu cpu): {variant: {fixture: {output: sha256}}}} from plain onnxruntime under qemu-user."""
    job = {"variants": {v.name: str(Path(v.path).resolve()) for v in variants}, "fixtures": []}
    for fx in fixtures:
        f = workdir / f"{fx.fixture_id}.bin"
        f.write_bytes(fx.array.astype(fx.array.dtype.newbyteorder("<")).tobytes())
        job["fixtures"].append({"id": fx.fixture_id, "input_name": fx.input_name, "dtype": fx.array.dtype.str,
                                "shape": list(fx.array.shape), "file": str(f)})
    runs, names = [], []
    for name in NEW:
        host = make_host(resolve_hosts([name])[0])
        argv, env = E.python_command(name, cpu=host.cpu)
        runs.append((argv, env, list(job["variants"]), 1))
        names.append(name)
    for cpu in SAME_FEATURES_AS_GRAVITON4:
        argv, env = E.python_command("graviton4", cpu=cpu)
        runs.append((argv, env, list(job["variants"]), 1))
        names.append(cpu)
    results = R.run_independent(runs, job, workdir)
    for name, res in zip(names, results):
        assert not res["errors"] and res["machine"] == "aarch64", (name, res["errors"])
    return {name: res["hashes"] for name, res in zip(names, results)}


@pytest.mark.slow
def test_arm_classes_follow_the_vector_lengths_and_sme_and_equal_plain_onnxruntime(workdir, arm_demo_equiv):
    from quantbench.runs.runner import run_hosts

    for name in FLEET:
        ok, msg = E.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")
    fixtures = _fixtures(2)
    variants = _variants(arm_demo_equiv.variants)
    # the session's equiv measured these hosts with these variants, fixtures and session: over a copy of its tables
    # the runner finds every result by its run_key (content: variant, fixture, fingerprint, session) and reads it
    root = workdir / "tables"
    shutil.copytree(arm_demo_equiv.tables, root)
    summary = run_hosts(list(FLEET), variants, fixtures, session={"intra_op_num_threads": 1}, progress=False,
                        tables_root=root)
    assert not summary.errors
    rows = partread.read("outputs", root, columns=["host", "variant", "fixture_id", "output_name", "sha256"]).to_pylist()
    ours: dict = {}
    for r in rows:
        ours.setdefault(r["host"], {}).setdefault(r["variant"], {}).setdefault(r["fixture_id"], {})[r["output_name"]] = \
            r["sha256"]
    by_lengths = [["docker-arm64"], ["graviton3"], ["graviton4"], ["orin", "pi"], ["phone-sme2"]]
    assert R.partition({h: ours[h]["fp32"] for h in FLEET}) == by_lengths
    assert R.partition({h: ours[h]["dynamic"] for h in FLEET}) == by_lengths
    assert R.partition({h: ours[h]["static-minmax"] for h in FLEET}) == [sorted(FLEET)]   # static QDQ: one class

    # the fingerprints say why: the vector lengths read inside each guest
    fps = {r["host"]: json.loads(r["fingerprint"])["identity"] for r in partread.read("hosts", root).to_pylist()}
    assert {h: (fps[h]["sve_vector_bits"], fps[h]["sme_vector_bits"]) for h in FLEET} == {
        "pi": (0, 0), "orin": (0, 0), "graviton3": (256, 0), "graviton4": (128, 0), "phone-sme2": (128, 512),
        "docker-arm64": (512, 256)}

    plain = _independent(workdir, variants, fixtures)
    for name in NEW:
        assert plain[name] == ours[name], f"{name}: quantbench's bytes are not plain onnxruntime's"
    for cpu in SAME_FEATURES_AS_GRAVITON4:   # another core name, the same features: graviton4's bytes
        assert plain[cpu] == ours["graviton4"], cpu
