"""onnxruntime sessions as every host makes them: the session options normalised (one value, SessionOptions), the
session made from model bytes with its required entries checked, its first run profiled (read_placement: the
provider of each node) in a profile folder of its own that a dead worker's successor sweeps, and the providers
checked against what the host has. onnxruntime is imported where a session is made, so importing this loads none."""

from __future__ import annotations

import hashlib
import json
import os


from quantbench.worker.protocol import JobError


DEFAULT_SESSION = {
    "intra_op_num_threads": 1,
    "inter_op_num_threads": 1,
    "execution_mode": "sequential",
    "graph_optimization_level": "all",
    "config_entries": {},
    "providers": ["CPUExecutionProvider"],
    "batch": 1,
}


GRAPH_OPT_LEVELS = ("disabled", "basic", "extended", "all")


#: the optional session option naming the config entries a variant requires (its recipe's session_requirements)
#: that the host's own session did not set: they are among "config_entries" too; absent when there are none
REQUIRED = "required_entries"


def normalize_session(session: "dict | None") -> dict:
    """Session options with defaults filled in; unknown keys are an error (typos change nothing silently)."""
    out = json.loads(json.dumps(DEFAULT_SESSION))
    for key, value in (session or {}).items():
        if key not in DEFAULT_SESSION and key != REQUIRED:
            raise ValueError("unknown session option %r; known: %s" % (key, ", ".join(sorted(DEFAULT_SESSION))))
        out[key] = value
    out["config_entries"] = {str(k): str(v) for k, v in sorted((out["config_entries"] or {}).items())}
    _normalize_required(out)
    out["providers"] = [str(p) for p in out["providers"]]
    if out["graph_optimization_level"] not in GRAPH_OPT_LEVELS:
        raise ValueError("graph_optimization_level %r: choose from %s" % (out["graph_optimization_level"], ", ".join(GRAPH_OPT_LEVELS)))
    if out["execution_mode"] not in ("sequential", "parallel"):
        raise ValueError("execution_mode %r: choose sequential or parallel" % (out["execution_mode"],))
    for key in ("intra_op_num_threads", "inter_op_num_threads", "batch"):
        out[key] = int(out[key])
    if out["batch"] < 1:
        raise ValueError("batch must be >= 1")
    return out


def _normalize_required(out: dict) -> None:
    """The required entries of a normalised session `out`: sorted str -> str, each one among its config entries
    with the same value; dropped when empty (a session without them keys as it always did)."""
    required = {str(k): str(v) for k, v in sorted((out.pop(REQUIRED, None) or {}).items())}
    for key, value in required.items():
        if out["config_entries"].get(key) != value:
            raise ValueError("required entry %s=%s is not among the config entries" % (key, value))
    if required:
        out[REQUIRED] = required


class SessionOptions:
    """onnxruntime's session options as one value: normalised once (normalize_session: defaults filled, unknown
    keys and bad values a ValueError), then keyed, layered and sent as they are. Standard library only, so this
    worker builds its sessions from the very value the workbench keys its results by.

    - wire(): the normalised options as a request carries them and a result records them (a fresh dict);
    - json() / key(): their canonical JSON and its SHA-256 (the session key in every run key);
    - layered(overrides): another layer on top (a hosts file's keys, the command line's): config entries merge
      key by key, a None value leaves the option as it was;
    - with_entries(entries): config entries added on top (a remedy's or a search candidate's);
    - required(entries) / own(): a variant's required entries added and named (REQUIRED), and taken off again.
    """

    __slots__ = ("_options",)

    def __init__(self, options=None):
        self._options = options.wire() if isinstance(options, SessionOptions) else normalize_session(options)

    def wire(self) -> dict:
        return json.loads(json.dumps(self._options))

    def json(self) -> str:
        return json.dumps(self._options, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)

    def key(self) -> str:
        return hashlib.sha256(self.json().encode()).hexdigest()

    def __getitem__(self, name: str):
        return self._options[name]

    def get(self, name: str, default=None):
        return self._options.get(name, default)

    def __eq__(self, other) -> bool:
        return isinstance(other, SessionOptions) and self.json() == other.json()

    def __hash__(self) -> int:
        return hash(self.json())

    def __repr__(self) -> str:
        return "SessionOptions(%s)" % self.json()

    def layered(self, overrides: "dict | None") -> "SessionOptions":
        out = self.wire()
        for key, value in (overrides or {}).items():
            if key == "config_entries":
                out["config_entries"] = dict(out["config_entries"], **(value or {}))
            elif value is not None:
                out[key] = value
        return SessionOptions(out)

    def with_entries(self, entries: "dict | None") -> "SessionOptions":
        return self.layered({"config_entries": entries or {}})

    def required(self, added: dict) -> "SessionOptions":
        """These options with `added` config entries, named as a variant's required entries (none: unchanged)."""
        if not added:
            return self
        out = self.wire()
        out["config_entries"] = dict(out["config_entries"], **added)
        out[REQUIRED] = added
        return SessionOptions(out)

    def own(self) -> "SessionOptions":
        """The host's own options of options a variant ran under (required's inverse)."""
        out = self.wire()
        added = out.pop(REQUIRED, None)
        if added:
            out["config_entries"] = {k: v for k, v in out["config_entries"].items() if k not in added}
        return SessionOptions(out)


_MODES = None


#: a session's profile folder: `quantbench-profile-<pid>@<8 hex of the host name>-<random>` (its owner named, so a
#: killed worker's folder is told from a live one's and swept by the next worker: sweep_profiles)
PROFILE_PREFIX = "quantbench-profile-"


_SWEPT: set = set()


def _owner() -> str:
    import socket

    return f"{os.getpid()}@{hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]}"


def profile_dir(scratch=None) -> str:
    """A new folder for one session's profile under `scratch` (None: the system's temporary folder), after the
    folders of dead workers there are swept (once per folder and process)."""
    import tempfile

    parent = scratch or tempfile.gettempdir()
    if parent not in _SWEPT:
        _SWEPT.add(parent)
        sweep_profiles(parent)
    return tempfile.mkdtemp(prefix=f"{PROFILE_PREFIX}{_owner()}-", dir=parent)


def sweep_profiles(parent) -> list:
    """Remove the profile folders in `parent` whose owner (a worker on this machine) is gone: a worker killed
    mid-run never ends its profile. A live owner's folder, another machine's or an unnamed one is kept."""
    import re
    import shutil

    me, removed = _owner().split("@")[1], []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return removed
    for name in names:
        m = re.fullmatch(re.escape(PROFILE_PREFIX) + r"(\d+)@([0-9a-f]{8})-\w+", name)
        if not m or m[2] != me or int(m[1]) == os.getpid() or os.path.islink(os.path.join(parent, name)):
            continue
        try:
            os.kill(int(m[1]), 0)
            continue   # alive (or another user's: kept)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
        except OSError:
            continue
    return removed


def make_session(model, session: dict, profile: bool = False, scratch=None):
    """An InferenceSession built exactly from `session`; returns (sess, resolved providers, readback).
    `profile`: onnxruntime profiles its first run, which read_placement reads back (and ends), in a folder
    under `scratch` (the run's own temporary folder, in its results; None: the system's)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir(scratch), "run")
    so.intra_op_num_threads = session["intra_op_num_threads"]
    so.inter_op_num_threads = session["inter_op_num_threads"]
    so.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if session["execution_mode"] == "sequential"
                         else ort.ExecutionMode.ORT_PARALLEL)
    so.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[session["graph_optimization_level"]]
    so.log_severity_level = 3
    for key, value in session["config_entries"].items():
        so.add_session_config_entry(key, value)
    if os.environ.get("QUANTBENCH_WORKER_SPIN") == "0":  # an emulated guest: its threads share the host's cores
        for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            if key not in session["config_entries"]:
                so.add_session_config_entry(key, "0")
    readback = {
        "intra_op_num_threads": so.intra_op_num_threads,
        "inter_op_num_threads": so.inter_op_num_threads,
        "execution_mode": str(so.execution_mode),
        "graph_optimization_level": str(so.graph_optimization_level),
        "config_entries": {k: so.get_session_config_entry(k) for k in session["config_entries"]},
    }
    providers = list(session["providers"])  # the host's deployed session's (hosts.deploy), overrides applied
    unknown = [p for p in providers if p not in ort.get_all_providers()]
    if unknown:
        raise ValueError("unknown execution provider %s; this onnxruntime %s has %s" % (
            ", ".join(unknown), ort.__version__, ", ".join(ort.get_available_providers())))
    _check_required(ort, session.get(REQUIRED) or {})
    sess = ort.InferenceSession(model, sess_options=so, providers=providers)
    return sess, list(sess.get_providers()), readback


_LIBRARY_KEYS = {}


def _check_required(ort, required: dict) -> None:
    """Refuse a required config entry this onnxruntime does not know (onnxruntime ignores an unknown key, so the
    session would run without it): its keys are strings in its shared library (inputs/configkeys.py alike)."""
    if not required:
        return
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    libs = sorted(f for f in os.listdir(capi) if f.startswith("libonnxruntime.so") or f == "onnxruntime.dll") \
        if os.path.isdir(capi) else []
    if not libs:
        return  # no library to read the keys from: onnxruntime's own behaviour decides
    import mmap

    path = os.path.join(capi, libs[0])
    for key in required:
        if (path, key) not in _LIBRARY_KEYS:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as lib:
                _LIBRARY_KEYS[(path, key)] = lib.find(b"\x00" + key.encode() + b"\x00") >= 0
    unknown = [k for k in required if not _LIBRARY_KEYS[(path, k)]]
    if unknown:
        raise ValueError("this onnxruntime %s does not know session config key %s" % (ort.__version__, ", ".join(unknown)))


def read_placement(sess) -> dict:
    """{provider: {op type: nodes}}: which execution provider ran each node of the session's profiled run
    (its profile's kernel events, the run itself; never the session object's provider list). Ends the
    profiling and removes the profile."""
    path = sess.end_profiling()
    if not path:
        return {}
    try:
        with open(path, "r") as fh:
            text = fh.read()
        try:
            events = json.loads(text)
        except ValueError as exc:
            raise _cut_short(path, exc)
    finally:
        try:
            os.remove(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    nodes = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "Node" and name.endswith("_kernel_time"):
            args = e.get("args") or {}
            nodes[name[:-len("_kernel_time")]] = (str(args.get("provider", "")), str(args.get("op_name", "")))
    out = {}
    for provider, op in nodes.values():
        ops = out.setdefault(provider, {})
        ops[op] = ops.get(op, 0) + 1
    return {p: dict(sorted(o.items())) for p, o in sorted(out.items())}


#: free bytes below which a profile that does not parse was cut short by a full disk: onnxruntime writes it from
#: C++ and reports no short write, and the event that did not fit is far smaller than this
PROFILE_ROOM = 1 << 16


def _cut_short(path, exc) -> Exception:
    """What a profile at `path` that is not JSON (`exc`) means: a full disk (a JobError of stage "disk" naming the
    profile's folder) when its file system has less than PROFILE_ROOM free, else `exc` itself."""
    folder = os.path.dirname(path)
    try:
        st = os.statvfs(folder)
        full = st.f_bavail * st.f_frsize < PROFILE_ROOM
    except (OSError, AttributeError):
        full = False
    if not full:
        return exc
    return JobError("disk", "onnxruntime's profile of the run was cut short (%s)" % (exc,), folder=folder)


def provider_problems(requested, available, placement=None) -> list:
    """What a run did not do of its provider request: a requested provider this onnxruntime does not have, or
    (with `placement`, read_placement's) one that took no node. The CPU provider as the last, fallback choice
    need not take any."""
    out = []
    for i, p in enumerate(requested):
        if p not in available:
            out.append("%s is not available in this onnxruntime (available: %s)" % (p, ", ".join(available)))
        elif placement is not None and p not in placement and not (p == "CPUExecutionProvider" and i == len(requested) - 1):
            ran = ", ".join("%s %d" % (q, sum(o.values())) for q, o in placement.items()) or "none"
            out.append("%s took no nodes (nodes per provider: %s)" % (p, ran))
    return out


def available_providers() -> list:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def check_providers(requested, require_providers: bool, placement=None) -> "str | None":
    """The refusal of a run whose providers are required (require_providers) and not all ran; None otherwise."""
    problems = provider_problems(requested, available_providers(), placement)
    if problems and require_providers:
        return "requested execution providers are required: %s" % "; ".join(problems)
    return None


def unsupported(exc, running: bool) -> bool:
    """Whether onnxruntime's error says this runtime cannot run the model (the host's result, stage
    "unsupported"): no kernel for an op or a provider failing as the session is made; while running, a
    provider's own fused node failing (an error in the model or its inputs fails on every host instead)."""
    text = str(exc)
    if running:
        return "RUNTIME_EXCEPTION" in text and "ExecutionProvider_" in text
    return "NOT_IMPLEMENTED" in text or "RUNTIME_EXCEPTION" in text
