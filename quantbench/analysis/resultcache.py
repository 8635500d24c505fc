"""The equiv analysis' results kept by content key, so a rerun on unchanged inputs reuses them.

An entry is one JSON file, ``<cache dir>/equiv/<key>.json``: a first line
``{"format": ..., "key": ..., "seal": ...}`` and then the payload's JSON text; the seal is
this machine's HMAC of the key and the payload (seal below), not a checksum anyone could
recompute. Results folders travel (copied, imported, unpacked from a release), so an entry
is never trusted: a missing, truncated, altered, forged (even with a fresh checksum),
foreign or wrongly-typed entry is a miss and the analysis runs again. Never pickle.

The key (equiv.analysis_key) hashes everything the analysis reads: the request, the
selected rows' output hashes, the hosts' identities, the fixtures' sources and the
analysis code itself (`code_version`). A payload is saved only when JSON gives it back
exactly (same types, same values), so a reused result renders the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from quantbench.store import lazy
from quantbench.store import tableschema
from quantbench.inputs.assets import quantbench_home
from quantbench.fsutil import atomic_write_bytes, content_key, keep_newest

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

FORMAT = 2   # 2: entries sealed (seal below), not checksummed
KEEP = 8  # entries kept per cache folder (the most recent)
_DTYPES = {"<i8", "<i4", "<f8", "<f4", "|b1", "<u8", "<u4", "|u1", "|i1"}
_CODE_VERSION = None


def code_version() -> str:
    """SHA-256 of the sources that compute the analysis (and numpy's version): new code, new keys."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        here = Path(__file__).resolve().parent
        files = sorted(here.glob("*.py")) + [here.parent / "store" / "hostresults.py", here.parent / "tensorcode.py",
                                             *sorted((here.parent / "worker").glob("*.py"))]
        h = hashlib.sha256(f"numpy {np.__version__}|format {FORMAT}".encode())
        for f in files:
            h.update(f"|{f.name}|".encode())
            h.update(f.read_bytes())
        _CODE_VERSION = h.hexdigest()
    return _CODE_VERSION


def cache_dir_of(results) -> Path:
    """The cache folder of a results folder (hidden, beside accuracy's: no release archive holds it)."""
    return Path(results) / ".cache"


_SEAL_KEY: dict = {}


def _seal_key() -> bytes | None:
    """This machine's secret for sealing cache entries: 32 random bytes in QUANTBENCH_HOME/cache-seal.key
    (mode 0600, made once, never travels with a results folder); None when it cannot be read or made."""
    path = quantbench_home() / "cache-seal.key"
    if path not in _SEAL_KEY:
        try:
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".cache-seal.", dir=path.parent)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(os.urandom(32))
                try:
                    os.link(tmp, path)  # the first writer's key wins; a second one reads it
                except FileExistsError:
                    pass
                finally:
                    os.unlink(tmp)
            key = path.read_bytes()
            _SEAL_KEY[path] = key if len(key) == 32 else None
        except OSError:
            return None
    return _SEAL_KEY[path]


def seal(data: bytes) -> str | None:
    """HMAC-SHA256 of `data` under this machine's secret (None: no secret here, nothing can be sealed).

    A cache entry carries its seal, not a checksum: anyone can recompute a SHA-256 over a forged entry, only
    this machine's quantbench its seal, so an entry forged or brought from elsewhere is a miss and is computed
    again."""
    key = _seal_key()
    return None if key is None else hmac.new(key, data, hashlib.sha256).hexdigest()


def sealed(data: bytes, mark) -> bool:
    """`mark` is the seal of `data` made on this machine."""
    want = seal(data)
    return want is not None and isinstance(mark, str) and hmac.compare_digest(want, mark)


def entry_path(cache_dir, key: str) -> Path:
    return Path(cache_dir) / "equiv" / f"{key}.json"


def load(cache_dir, key: str) -> dict | None:
    """The payload stored under `key`, or None (absent or damaged: never an error)."""
    try:
        data = entry_path(cache_dir, key).read_bytes()
        head, _, body = data.partition(b"\n")
        meta = json.loads(head)
        if not (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("key") == key
                and sealed(key.encode() + b"\n" + body, meta.get("seal"))):
            return None
        payload = json.loads(body)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def save(cache_dir, key: str, payload: dict) -> bool:
    """Store `payload` under `key` when JSON gives it back exactly; keeps the KEEP newest entries."""
    try:
        body = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
        if not same(json.loads(body), payload):
            return False
        mark = seal(key.encode() + b"\n" + body)
        if mark is None:   # nothing to seal it with here: not kept
            return False
        head = json.dumps({"format": FORMAT, "key": key, "seal": mark}).encode()
        path = atomic_write_bytes(entry_path(cache_dir, key), head + b"\n" + body)
        keep_newest(path.parent, "*.json", KEEP)
        return True
    except (OSError, TypeError, ValueError):
        return False


def same(a, b) -> bool:
    """a and b hold the same values of the same types (NaN equals NaN): a JSON round trip lost nothing."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def array_to_json(a: np.ndarray) -> list:
    """[dtype, shape, base64 of the C-order bytes]: exact, and quick to read back."""
    a = np.ascontiguousarray(a)
    return [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode()]


def array_from_json(x) -> np.ndarray:
    """The array `array_to_json` wrote; ValueError when `x` is not one."""
    if not (isinstance(x, list) and len(x) == 3 and x[0] in _DTYPES and isinstance(x[1], list)
            and all(isinstance(d, int) and d >= 0 for d in x[1]) and isinstance(x[2], str)):
        raise ValueError("not an array entry")
    dt = np.dtype(x[0])
    raw = base64.b64decode(x[2], validate=True)
    if len(raw) != dt.itemsize * math.prod(x[1]):
        raise ValueError("array size does not match its shape")
    return np.frombuffer(raw, dtype=dt).reshape(x[1]).copy()


def arrays_to_json(arrays: list) -> list:
    """Many arrays (or None) as one entry: ["joined", dtype, trailing shape, first dims (-1: None), base64 of
    all their bytes] when they share dtype and trailing shape (read back in one go), else ["each", [...]]."""
    have = [np.ascontiguousarray(a) for a in arrays if a is not None]
    if have and all(a.ndim >= 1 and a.dtype == have[0].dtype and a.shape[1:] == have[0].shape[1:] for a in have):
        data = b"".join(a.tobytes() for a in have)
        return ["joined", have[0].dtype.str, list(have[0].shape[1:]), [-1 if a is None else len(a) for a in arrays],
                base64.b64encode(data).decode()]
    return ["each", [None if a is None else array_to_json(a) for a in arrays]]


def arrays_from_json(x, n: int) -> list:
    """The `n` arrays `arrays_to_json` wrote; ValueError when `x` is not such an entry."""
    if isinstance(x, list) and len(x) == 2 and x[0] == "each" and isinstance(x[1], list) and len(x[1]) == n:
        return [None if a is None else array_from_json(a) for a in x[1]]
    if not (isinstance(x, list) and len(x) == 5 and x[0] == "joined" and x[1] in _DTYPES and isinstance(x[2], list)
            and all(isinstance(d, int) and d >= 0 for d in x[2]) and isinstance(x[3], list) and len(x[3]) == n
            and all(isinstance(d, int) and d >= -1 for d in x[3]) and isinstance(x[4], str)):
        raise ValueError("not an arrays entry")
    dt, tail = np.dtype(x[1]), tuple(x[2])
    raw = base64.b64decode(x[4], validate=True)
    rows = sum(d for d in x[3] if d > 0)
    if len(raw) != dt.itemsize * rows * math.prod(tail):
        raise ValueError("arrays size does not match their shapes")
    flat = np.frombuffer(raw, dtype=dt).reshape((rows, *tail)).copy()
    out, at = [], 0
    for d in x[3]:
        out.append(None if d < 0 else flat[at:at + d])
        at += max(d, 0)
    return out


def rows_typed(name: str, rows: list) -> bool:
    """Every row is a dict whose values have the Python types of table `name`'s columns (None: null),
    and no other keys: rows read from an entry that the table (and the report) can take."""
    want = {}
    for col, t, _ in tableschema.COLUMNS[name]:
        at = t.arrow
        want[col] = ((str,) if pa.types.is_string(at) else (bool,) if pa.types.is_boolean(at)
                     else (int,) if pa.types.is_integer(at) else (float, int) if pa.types.is_floating(at)
                     else (list,) if pa.types.is_list(at) else None)
    for r in rows:
        if not isinstance(r, dict) or not r.keys() <= want.keys():
            return False
        for k, v in r.items():
            ok = want[k]
            if v is None or ok is None:
                continue
            if not isinstance(v, ok) or (isinstance(v, bool) and bool not in ok):
                return False
    return True


def key_of(parts: dict) -> str:
    """The analysis key of `parts` (with the code version)."""
    return content_key({"format": FORMAT, "code": code_version(), **parts})
