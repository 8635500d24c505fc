"""Identity and cache keys of host results: session keys, run keys, the fingerprint probe, hosts rows.

Plain functions of their arguments (and of the local onnxruntime version), shared by
the runner, imported hosts (which re-derive every key to check a results file),
the explain commands and `quantbench hosts`. Imports nothing from the runner, the
registry or the host kinds, so any of them may import it.

    run_key = sha256(variant_id | fixture_id | fingerprint_id | session_key)
"""

from __future__ import annotations

import functools
import hashlib

from quantbench.errors import UserError
from quantbench.fsutil import canonical_json
from quantbench import worker
from quantbench import tensorcode

# --------------------------------------------------------------------------- keys


def session_options(session, overrides: dict | None = None) -> worker.SessionOptions:
    """Session options (a dict, None: the defaults, or a SessionOptions) as the worker's one value type, normalised,
    with `overrides` layered on top (config entries merge key by key); a bad option is a UserError."""
    try:
        options = worker.SessionOptions(session)
        return options.layered(overrides) if overrides else options
    except ValueError as exc:
        raise UserError(f"session options: {exc}") from None


def normalize_session(session: dict | None) -> dict:
    """Session options with the worker's defaults filled in (a bad option is a UserError), as a request sends them."""
    return session_options(session).wire()


def session_key(session: dict | None) -> str:
    """SHA-256 of the canonical JSON of the normalised session options (SessionOptions.key)."""
    return session_options(session).key()


def run_key(variant_id: str, fixture_id: str, fingerprint_id: str, session_key: str) -> str:
    """The cache key of one (variant, fixture) result on one fingerprint under one session."""
    return hashlib.sha256("|".join((variant_id, fixture_id, fingerprint_id, session_key)).encode()).hexdigest()


# --------------------------------------------------------------------------- probe


_PROBE = None


def probe_model() -> tuple[bytes, object]:
    """A tiny MatMul+Add+Relu model and its input: resolves providers and smoke-tests a host."""
    global _PROBE
    if _PROBE is None:
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper

        w = numpy_helper.from_array(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4), "w")
        b = numpy_helper.from_array(np.linspace(-0.5, 0.5, 4, dtype=np.float32), "b")
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])],
            "quantbench-probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
            [w, b],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="quantbench")
        m.ir_version = 8
        x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
        _PROBE = (m.SerializeToString(), x)
    return _PROBE


def request_header(kind: str, host: str, session: dict, require_providers: bool, model: dict, fixtures: list,
                   **fields) -> dict:
    """The header of one worker request ("run" or "fingerprint", read by the worker): the one place a request
    is encoded. `model`: where its bytes are (model_entry, or {"path", "sha256"}); `fixtures`: fixture_entry
    each; `fields`: the rest (return_tensors, repeat, output_names, store, variant names)."""
    return {"type": kind, "host": host, "session": session, "require_providers": require_providers, "model": model,
            "fixtures": fixtures, **fields}


def model_entry(data: bytes, offset: int = 0) -> dict:
    """A model travelling as bytes at `offset` of the payload."""
    return {"offset": offset, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def fixture_entry(fixture_id: str, input_name: str, array, offset: int, nbytes: int) -> dict:
    """One input of a request: its tensor's `nbytes` at `offset` (of the payload, or of the run's input store)."""
    return {"fixture_id": fixture_id, "input_name": input_name, "dtype": tensorcode.canonical(array).dtype.str,
            "shape": list(array.shape), "offset": offset, "nbytes": nbytes}


def probe_job() -> tuple[dict, list, list[bytes]]:
    """(model, fixtures, payload parts) of the fingerprint request: the probe model on its input."""
    data, x = probe_model()
    xb = tensorcode.tensor_bytes(x)
    return model_entry(data), [fixture_entry(tensorcode.tensor_sha256(x), "x", x, len(data), len(xb))], [data, xb]


def local_probe_sha256() -> str | None:
    """The probe's output hash on this interpreter's onnxruntime (what a host's smoke job is compared with);
    None when it cannot run here."""
    try:
        import onnxruntime as ort

        data, x = probe_model()
        return tensorcode.tensor_sha256(ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0])
    except Exception:
        return None


def cpu_summary(fp: dict) -> str:
    cpu = fp["identity"].get("cpu", {})
    if "cores" in cpu:
        parts = []
        for c in cpu["cores"]:
            parts.append(" ".join(f"{k.split()[-1]} {c[k]}" for k in
                                  ("CPU implementer", "CPU part", "CPU variant", "CPU revision") if k in c))
        return "; ".join(parts) or "arm (no MIDR in /proc/cpuinfo)"
    bits = [cpu.get("vendor_id", ""), f"family {cpu['cpu_family']}" if "cpu_family" in cpu else "",
            f"model {cpu['model']}" if "model" in cpu else "", f"({cpu['model_name']})" if "model_name" in cpu else ""]
    return " ".join(b for b in bits if b) or fp["identity"].get("arch", "")


def hosts_row(host: str, kind: str, fp: dict, fid: str) -> dict:
    ident = fp["identity"]
    return {"fingerprint_id": fid, "host": host, "kind": kind, "arch": ident.get("arch", ""),
            "cpu": cpu_summary(fp), "isa_flags": list(ident.get("isa_flags", [])),
            "ort_version": ident.get("onnxruntime", {}).get("version", ""),
            "fingerprint": canonical_json(dict(fp, kind=kind))}


def not_started_row(host: str, kind: str, reason: str, runtime: str) -> dict:
    """The hosts row of a host whose runtime does not start on its CPU (`reason`; `runtime`: the host as
    described): its fingerprint is what is known without a worker, so the row is found by its host name."""
    fp = {"identity": {"does_not_start": reason, "runtime": runtime}, "info": {}}
    version = (reason.split() + ["", ""])[1] if reason.startswith("onnxruntime ") else ""
    return {"fingerprint_id": worker.fingerprint_id(fp), "host": host, "kind": kind, "arch": "", "cpu": "",
            "isa_flags": [], "ort_version": version, "fingerprint": canonical_json(dict(fp, kind=kind))}


@functools.lru_cache(maxsize=1)
def local_ort_version() -> str:
    """The onnxruntime version of this interpreter (package metadata, else the module's own);
    emulated hosts must match it and their wheel folder is keyed by it. Read once: a metadata lookup
    scans every installed distribution, and a run asks for it per host and per worker."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime")
    except PackageNotFoundError:
        pass
    try:
        import onnxruntime
    except ImportError:
        raise UserError("onnxruntime is not installed in this Python; install quantbench's dependencies first") from None
    return onnxruntime.__version__
