"""Tiny ONNX models and fixtures for the hosts tests (built with onnx.helper; the demo models are not the point)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench.inputs.fixtures import Fixture
from quantbench.store import hostresults
from quantbench.tensorcode import tensor_sha256
from quantbench.inputs.variantdir import Variant
from models import matmul_model, gather_model, slow_model, image_model  # noqa: F401 (the catalogue: tests/models.py)


def fixtures(count: int, n: int = 16, first_values=None) -> list[Fixture]:
    """`count` random fixtures for input x[1,n]; first_values sets x[0,0] per fixture (gather_model)."""
    out = []
    for i in range(count):
        a = np.random.RandomState(100 + i).rand(1, n).astype(np.float32)
        if first_values is not None:
            a[0, 0] = first_values[i]
        out.append(Fixture(tensor_sha256(a), "x", a, f"fx{i:02d}.png", "0" * 64, split="eval"))
    return out


def variant(path, name: str = "fp32", model: str = "tiny") -> Variant:
    return Variant(name=name, path=Path(path), model=model, recipe={"variant": name})


def make_corpus(folder, count: int = 3, size: int = 8) -> Path:
    """`count` random PNGs and a COCO labels.json (all in the eval split); returns the labels path."""
    import json

    from PIL import Image

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images = []
    for i in range(count):
        px = np.random.RandomState(i).randint(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(px).save(folder / "images" / f"im{i}.png")
        images.append({"id": i + 1, "file_name": f"im{i}.png", "width": size, "height": size, "split": "eval"})
    labels = folder / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": [], "categories": [{"id": 1, "name": "litter"}]}))
    return labels


def need_cores(n: int) -> None:
    """A test of an n-thread local host: threads are capped at the cores this process may use (hosts.deploy), so
    on fewer (`taskset -c 0`) the host is refused, a fact of the run, and the test is skipped saying so."""
    import os

    import pytest

    have = len(os.sched_getaffinity(0))
    if have < n:
        pytest.skip(f"this process may use {have} core(s): a {n}-thread local host is refused here")


def host_results_index(tables_root, host=None, variant_id=None, session_key=None) -> dict:
    """{(host, variant_id, fixture_id, output_name): sha256}: hashes only, no tensors read.

    If a host has results under several fingerprints or sessions, filter by
    session_key (or use latest_fingerprints) to compare like with like.
    """
    t = hostresults.load_outputs(host=host, variant_id=variant_id, session_key=session_key, tensors=False, tables_root=tables_root)
    cols = [t.column(c).to_pylist() for c in ("host", "variant_id", "fixture_id", "output_name", "sha256")]
    return {(h, v, f, o): s for h, v, f, o, s in zip(*cols)}


def hashes_by_host(variant_id: str, tables_root, session_key=None, hosts=None, fingerprint_id=None) -> dict:
    """{host: {(fixture_id, output_name): sha256}} for one variant: the input of equivalence classes.

    A host that ran under several fingerprints (an upgrade) or sessions has rows for
    each: pass session_key and fingerprint_id (e.g. RunSummary.fingerprints().values())
    to compare one run's state.
    """
    t = hostresults.load_outputs(host=hosts, variant_id=variant_id, session_key=session_key, fingerprint_id=fingerprint_id,
                     tensors=False, tables_root=tables_root)
    out: dict = defaultdict(dict)
    for h, f, o, s in zip(*(t.column(c).to_pylist() for c in ("host", "fixture_id", "output_name", "sha256"))):
        out[h][(f, o)] = s
    return dict(out)


def reseal_export(path) -> Path:
    """The export at `path` with its manifest's member SHA-256s recomputed from the members as they now are: a
    forger who knows the format does this, so the checks behind the checksums are what a forgery meets."""
    import hashlib
    import io
    import json
    import tarfile

    path = Path(path)
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    data = dict((m.name, d) for m, d in members)
    manifest = json.loads(data["manifest.json"])
    manifest["sha256"] = {n: hashlib.sha256(d).hexdigest() for n, d in data.items() if n.endswith(".parquet")}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for m, d in members:
            if m.name == "manifest.json":
                d = json.dumps(manifest).encode()
            m.size = len(d)
            tar.addfile(m, io.BytesIO(d))
    return path


def count_starts(monkeypatch) -> list:
    """The names of the hosts whose worker process starts from now on (ProcessHost.start), in order."""
    from quantbench.hosts.process import ProcessHost

    starts = []
    real = ProcessHost.start

    def start(self):
        starts.append(self.name)
        return real(self)

    monkeypatch.setattr(ProcessHost, "start", start)
    return starts
