"""The worker protocol, input verification, provider read-back and the fingerprint, against real onnxruntime."""

import hashlib
import struct

import numpy as np
import onnxruntime as ort
import pytest

from hosts_helpers import gather_model, matmul_model
from quantbench import worker as W
from quantbench import tensorcode
from quantbench.hosts.keys import probe_job, request_header
from quantbench.hosts.local import LocalHost


@pytest.fixture(scope="module")
def client():
    c = LocalHost("local", "local").start()
    yield c
    c.close()


def fingerprint_request(host: str, session: dict, allow_fallback: bool) -> tuple[dict, list[bytes]]:
    """A fingerprint request as WorkerClient.open sends it (keys.request_header over keys.probe_job), for the
    tests that speak the protocol to a worker directly."""
    model, fixtures, parts = probe_job()
    return request_header("fingerprint", host, session, allow_fallback, model, fixtures), parts


def _job(model_path, arrays, session=None, sha=None, **extra):
    parts, fxs, off = [], [], 0
    for i, a in enumerate(arrays):
        raw = tensorcode.tensor_bytes(a)
        fxs.append({"fixture_id": tensorcode.tensor_sha256(a), "sha256": (sha[i] if sha else None) or tensorcode.tensor_sha256(a),
                    "input_name": "x", "dtype": a.dtype.str, "shape": list(a.shape), "offset": off, "nbytes": len(raw)})
        parts.append(raw)
        off += len(raw)
    header = {"type": "run", "host": "h1", "variant": "v1", "model": {"path": str(model_path)},
              "session": session or {}, "fixtures": fxs}
    header.update(extra)
    return header, parts


def test_canonical_hash_is_documented_encoding():
    a = np.arange(6, dtype=">i4").reshape(2, 3)  # big-endian input hashes as little-endian
    raw = np.arange(6, dtype="<i4").tobytes()
    assert tensorcode.tensor_sha256(a) == hashlib.sha256(b"<i4|2,3|" + raw).hexdigest()
    assert tensorcode.tensor_sha256(np.float32(1.5)) == hashlib.sha256(b"<f4||" + np.float32(1.5).tobytes()).hexdigest()
    back = tensorcode.tensor_from_bytes(tensorcode.tensor_bytes(a), "<i4", [2, 3])
    assert back.tolist() == a.tolist()


def test_outputs_match_direct_onnxruntime(tmp_path, client):
    model = matmul_model(tmp_path / "m.onnx")
    xs = [np.random.RandomState(i).rand(1, 16).astype(np.float32) for i in range(3)]
    header, payload = _job(model, xs)
    frames = list(client.request(header, payload))
    assert frames[0][0]["type"] == "session" and frames[0][0]["providers"] == ["CPUExecutionProvider"]
    results = [f for f in frames if f[0]["type"] == "result"]
    assert [h["fixture_id"] for h, _ in results] == [tensorcode.tensor_sha256(x) for x in xs]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    for (h, p), x in zip(results, xs):
        want = sess.run(None, {"x": x})
        assert [o["name"] for o in h["outputs"]] == ["logits", "probs"]
        for o, w in zip(h["outputs"], want):
            got = tensorcode.tensor_from_bytes(p[o["offset"]:o["offset"] + o["nbytes"]], o["dtype"], o["shape"])
            assert o["sha256"] == tensorcode.tensor_sha256(w) == tensorcode.tensor_sha256(got)
            assert np.array_equal(got, w)


def test_model_bytes_repeat_and_output_subset(tmp_path, client):
    model = matmul_model(tmp_path / "m.onnx")
    data = model.read_bytes()
    x = np.ones((1, 16), np.float32)
    header, parts = _job(model, [x], repeat=3, output_names=["probs"], return_tensors=False)
    header["model"] = {"offset": 0, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    for f in header["fixtures"]:
        f["offset"] += len(data)
    results = [h for h, _ in client.request(header, [data] + parts) if h["type"] == "result"]
    assert [r["repeat"] for r in results] == [0, 1, 2]
    assert all([o["name"] for o in r["outputs"]] == ["probs"] and "offset" not in r["outputs"][0] for r in results)
    assert len({r["outputs"][0]["sha256"] for r in results}) == 1


def test_input_hash_mismatch_is_an_error(tmp_path, client):
    model = matmul_model(tmp_path / "m.onnx")
    x = np.ones((1, 16), np.float32)
    header, payload = _job(model, [x], sha=["0" * 64])
    frames = [h for h, _ in client.request(header, payload)]
    assert [f["type"] for f in frames] == ["session", "error"]
    err = frames[-1]
    assert err["stage"] == "input" and "SHA-256 mismatch" in err["message"]
    assert err["host"] == "h1" and err["variant"] == "v1" and err["fixture_id"] == tensorcode.tensor_sha256(x)


def test_a_later_input_mismatch_stops_the_job_at_that_fixture(tmp_path, client):
    # inputs are hashed on a helper thread ahead of the runs; none runs before its check
    model = matmul_model(tmp_path / "m.onnx")
    xs = [np.full((1, 16), float(i), np.float32) for i in range(4)]
    header, payload = _job(model, xs, sha=[None, None, "f" * 64, None])
    frames = [h for h, _ in client.request(header, payload)]
    assert [f["type"] for f in frames] == ["session", "result", "result", "error"]
    assert [f["fixture_id"] for f in frames[1:3]] == [tensorcode.tensor_sha256(x) for x in xs[:2]]
    assert frames[-1]["stage"] == "input" and frames[-1]["fixture_id"] == tensorcode.tensor_sha256(xs[2])
    ok = [h for h, _ in client.request(*_job(model, xs))]
    assert [f["type"] for f in ok] == ["session"] + ["result"] * 4 + ["verified"]
    assert ok[-1]["fixtures"] == 4 and ok[-1]["verify_seconds"] >= 0.0


def test_unresolved_provider_is_reported_not_replaced(tmp_path, client):
    model = matmul_model(tmp_path / "m.onnx")
    x = np.ones((1, 16), np.float32)
    session = {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    frames = [h for h, _ in client.request(*_job(model, [x], session=session, require_providers=True))]
    assert [f["type"] for f in frames] == ["error"]
    assert frames[0]["stage"] == "providers" and "CUDAExecutionProvider" in frames[0]["message"]
    ok = [h for h, _ in client.request(*_job(model, [x], session=session))]   # by default: run, and say so
    assert ok[0]["type"] == "session" and "CUDAExecutionProvider is not available" in ok[0]["provider_problems"][0]
    assert ok[1]["type"] == "result" and set(ok[1]["placement"]) == {"CPUExecutionProvider"}
    assert "CUDAExecutionProvider is not available" in ok[1]["provider_problems"][0]


def test_run_time_exception_names_fixture_and_keeps_earlier_results(tmp_path, client):
    model = gather_model(tmp_path / "g.onnx")
    xs = []
    for v in (1, 2, 9, 3):  # 9 is out of range for Gather over 4 elements
        a = np.zeros((1, 16), np.float32)
        a[0, 0] = v
        xs.append(a)
    frames = [h for h, _ in client.request(*_job(model, xs))]
    assert [f["type"] for f in frames] == ["session", "result", "result", "error"]
    assert frames[-1]["stage"] == "run" and frames[-1]["fixture_id"] == tensorcode.tensor_sha256(xs[2])
    assert frames[-1]["host"] == "h1" and frames[-1]["variant"] == "v1"


def test_bad_session_option_and_unknown_request(tmp_path, client):
    model = matmul_model(tmp_path / "m.onnx")
    frames = [h for h, _ in client.request(*_job(model, [np.ones((1, 16), np.float32)], session={"threads": 2}))]
    assert frames[0]["type"] == "error" and "unknown session option 'threads'" in frames[0]["message"]
    frames = [h for h, _ in client.request({"type": "bogus"})]
    assert frames[0]["type"] == "error" and frames[0]["stage"] == "protocol"


def test_fingerprint_fields_and_id(client):
    session = W.normalize_session({"config_entries": {"session.x64quantprecision": "1"}})
    frames = [h for h, _ in client.request(*fingerprint_request("h1", session, False))]
    fp = frames[0]
    ident = fp["fingerprint"]["identity"]
    assert ident["onnxruntime"]["version"] == ort.__version__
    assert ident["numpy"] == np.__version__
    assert ident["resolved_providers"] == ["CPUExecutionProvider"]
    assert ident["session"]["config_entries"] == {"session.x64quantprecision": "1"}
    assert ident["session_readback"]["config_entries"] == {"session.x64quantprecision": "1"}
    assert ident["session"]["intra_op_num_threads"] == 1 and ident["isa_flags"]
    assert fp["fingerprint_id"] == W.fingerprint_id(fp["fingerprint"])
    # host-specific info does not change the id; a numerics field does
    other = {"identity": ident, "info": dict(fp["fingerprint"]["info"], hostname="elsewhere")}
    assert W.fingerprint_id(other) == fp["fingerprint_id"]
    changed = {"identity": dict(ident, numpy="0.0"), "info": {}}
    assert W.fingerprint_id(changed) != fp["fingerprint_id"]
    assert len(fp["probe_sha256"]) == 1


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1
"""


def test_cpuinfo_and_auxv_decoding(tmp_path):
    info = W.read_cpuinfo(ARM_CPUINFO)
    assert info["arm_cores"] == [{"CPU implementer": "0x41", "CPU architecture": "8", "CPU variant": "0x4",
                                  "CPU part": "0xd0b", "CPU revision": "1"}]
    assert "asimddp" in info["features"]
    hwcap = (1 << 0) | (1 << 1) | (1 << 20)  # fp asimd asimddp
    hwcap2 = (1 << 13) | (1 << 14) | (1 << 63)  # i8mm bf16 poe
    auxv = tmp_path / "auxv"
    auxv.write_bytes(struct.pack("<6Q", 6, 4096, W.AT_HWCAP, hwcap, W.AT_HWCAP2, hwcap2) + struct.pack("<2Q", 0, 0))
    got = W.read_auxv(str(auxv))
    assert got == {"hwcap": hwcap, "hwcap2": hwcap2}
    assert W.decode_bits(hwcap, W.ARM64_HWCAP) == ["fp", "asimd", "asimddp"]
    assert W.decode_bits(hwcap2, W.ARM64_HWCAP2) == ["i8mm", "bf16", "poe"]
    assert W.decode_bits(1 << 70, ["a"]) == ["bit70"]
    real = W.read_auxv()
    assert "hwcap" in real  # this machine's kernel provides AT_HWCAP


def test_worker_runs_without_quantbench_on_the_path(tmp_path):
    """The worker as it reaches a bare host answers a fingerprint request without quantbench importable: sent as
    source (ssh's bootstrap reading worker_preamble: its sources in load order, the entry last), and started by path
    from its files alone (the worker folder's sources and, beside the folder, tensorcode.py)."""
    import io
    import subprocess
    import sys

    import os

    from quantbench.hosts.process import WORKER_PATH, without_process_mask
    from quantbench.hosts.ssh import BOOTSTRAP, worker_preamble

    header, payload = fingerprint_request("bare", W.normalize_session(None), False)
    buf = io.BytesIO()
    W.write_frame(buf, header, payload)
    W.write_frame(buf, {"type": "end"})
    (tmp_path / "pkg" / "worker").mkdir(parents=True)
    for source in WORKER_PATH.parent.glob("*.py"):
        (tmp_path / "pkg" / "worker" / source.name).write_bytes(source.read_bytes())
    (tmp_path / "pkg" / "tensorcode.py").write_bytes((WORKER_PATH.parents[1] / "tensorcode.py").read_bytes())
    for argv, stdin in (([sys.executable, "-I", "-c", BOOTSTRAP], worker_preamble() + buf.getvalue()),
                        ([sys.executable, "-I", str(tmp_path / "pkg" / "worker" / WORKER_PATH.name)], buf.getvalue())):
        # a bare host has no CPUID mask of ours (`-I` drops the masked copy's path, not the preloaded shim)
        p = subprocess.run(argv, input=stdin, capture_output=True, cwd=tmp_path, timeout=300,
                           env=without_process_mask(dict(os.environ)))
        assert p.returncode == 0, p.stderr.decode()
        out = io.BytesIO(p.stdout)
        first = W.read_frame(out)[0]
        assert first["type"] == "fingerprint" and first["fingerprint"]["identity"]["arch"]
        assert W.read_frame(out)[0]["type"] == "done"


def test_inputs_from_a_store_file(tmp_path, client):
    """Local hosts map the inputs from one file written per run; the hashes are still checked."""
    model = matmul_model(tmp_path / "m.onnx")
    xs = [np.random.RandomState(i).rand(1, 16).astype(np.float32) for i in range(2)]
    store = tmp_path / "inputs.bin"
    store.write_bytes(b"".join(tensorcode.tensor_bytes(x) for x in xs))
    fxs = [{"fixture_id": tensorcode.tensor_sha256(x), "input_name": "x", "dtype": "<f4", "shape": [1, 16],
            "file": str(store), "offset": 64 * i, "nbytes": 64} for i, x in enumerate(xs)]
    header = {"type": "run", "host": "h1", "variant": "v1", "model": {"path": str(model)}, "session": {}, "fixtures": fxs}
    res = [h for h, _ in client.request(header) if h["type"] == "result"]
    assert [r["fixture_id"] for r in res] == [f["fixture_id"] for f in fxs]
    bad = dict(header, fixtures=[dict(fxs[0], offset=64)])  # bytes of fixture 1 under fixture 0's hash
    frames = [h for h, _ in client.request(bad)]
    assert [f["type"] for f in frames] == ["session", "error"] and frames[-1]["stage"] == "input"


def test_run_level_store_and_a_truncated_store(tmp_path, client):
    """The parent names the store once per run; an offset past its end is an input error, not a crash."""
    model = matmul_model(tmp_path / "m.onnx")
    xs = [np.random.RandomState(i).rand(1, 16).astype(np.float32) for i in range(3)]
    store = tmp_path / "inputs.bin"
    store.write_bytes(b"".join(tensorcode.tensor_bytes(x) for x in xs[:2]))  # the third tensor is missing
    fxs = [{"fixture_id": tensorcode.tensor_sha256(x), "input_name": "x", "dtype": "<f4", "shape": [1, 16],
            "offset": 64 * i, "nbytes": 64} for i, x in enumerate(xs)]
    header = {"type": "run", "host": "h1", "variant": "v1", "model": {"path": str(model)}, "session": {},
              "fixtures": fxs, "store": str(store)}
    frames = [h for h, _ in client.request(header)]
    assert [f["type"] for f in frames] == ["session", "result", "result", "error"]
    assert frames[-1]["stage"] == "input" and frames[-1]["fixture_id"] == fxs[2]["fixture_id"]
    assert "past the end of the input store" in frames[-1]["message"]


class _SlowPipe:
    """A writer that takes its time, as a busy parent does: frames must still leave complete and in order."""

    def __init__(self):
        import io

        self.buf = io.BytesIO()

    def write(self, data):
        import time

        time.sleep(0.0005)
        return self.buf.write(data)

    def flush(self):
        pass


def test_results_leave_in_order_behind_a_slow_reader(tmp_path, monkeypatch):
    """More results than the sender's backlog: the compute thread waits, nothing is lost or reordered."""
    import io

    monkeypatch.setattr(W.jobs._Sender, "BACKLOG", 4)
    model = matmul_model(tmp_path / "m.onnx")
    xs = [np.random.RandomState(i).rand(1, 16).astype(np.float32) for i in range(40)]
    header, parts = _job(model, xs, repeat=2)
    out = _SlowPipe()
    W.run_job(header, b"".join(parts), out)
    stream = io.BytesIO(out.buf.getvalue())
    frames = []
    while (f := W.read_frame(stream)) is not None:
        frames.append(f)
    kinds = [h["type"] for h, _ in frames]
    assert kinds == ["session"] + ["result"] * 80 + ["verified"]
    got = [(h["fixture_id"], h["repeat"]) for h, _ in frames[1:-1]]
    assert got == [(tensorcode.tensor_sha256(x), r) for x in xs for r in (0, 1)]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    for (h, _), x in zip(frames[1:-1:2], xs):
        assert [o["sha256"] for o in h["outputs"]] == [tensorcode.tensor_sha256(w) for w in sess.run(None, {"x": x})]


def test_worker_reuses_a_session_for_the_same_model_and_options(tmp_path):
    import io

    from quantbench import worker as W

    W.jobs._SESSIONS.clear()
    model = matmul_model(tmp_path / "m.onnx")
    a = np.ones((1, 16), np.float32)

    def job(session):
        raw = tensorcode.tensor_bytes(a)
        return {"type": "run", "host": "h", "variant": "v", "model": {"path": str(model)}, "session": session,
                "fixtures": [{"fixture_id": tensorcode.tensor_sha256(a), "input_name": "x", "dtype": "<f4", "shape": [1, 16],
                              "offset": 0, "nbytes": len(raw)}]}, [raw]

    inp = io.BytesIO()
    for sess in ({}, {}, {"graph_optimization_level": "basic"}, {}):  # same, same, other options, first again
        W.write_frame(inp, *job(sess))
    inp.seek(0)
    out = io.BytesIO()
    W.serve(inp, out)
    out.seek(0)
    frames = []
    while (f := W.read_frame(out)) is not None:
        frames.append(f[0])
    reused = [f["reused"] for f in frames if f["type"] == "session"]
    assert reused == [False, True, False, False]  # one session kept at a time
    results_ = [f for f in frames if f["type"] == "result"]
    assert len({tuple(o["sha256"] for o in f["outputs"]) for f in results_}) == 1
