"""The session config keys onnxruntime knows, so a misspelt one (`session.x64quantprecison=1`) is refused with
the nearest known key instead of being passed on, ignored by onnxruntime and shown as applied.

onnxruntime keeps its keys (onnxruntime_session_options_config_keys.h: `session.*`, `optimization.*`, `mlas.*`)
as strings in its library; they are read from this interpreter's onnxruntime library once per install (cached
by the library's file state under ~/.cache/quantbench/config-keys). Keys of other families (`ep.*`, a
provider's own) are not checked: their lists live in the providers.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError
from quantbench.fsutil import content_key, file_state, read_cached_json, write_cache_entry

FAMILIES = ("session.", "optimization.", "mlas.")
_KEY = re.compile(rb"(?<=\x00)((?:session|optimization|mlas)\.[a-z0-9_.]*[a-z0-9_])(?=\x00)")
#: keys a build may hold only as instruction immediates: an x86-64 compiler stores a short key it compares in
#: 16-byte chunks, so the library's strings hold the key's first 16 bytes, not the key (onnxruntime 1.32.0's x86-64
#: wheel: "mlas.disable_kle" alone; its aarch64 wheel holds the whole key). Known where that head is in the library.
INLINED = ("mlas.disable_kleidiai",)
#: what the scan reads (a change re-reads every cached library)
_SCAN = 2


def _library() -> Path | None:
    """This interpreter's onnxruntime shared library (None when there is none to read)."""
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    capi = Path(list(spec.submodule_search_locations)[0]) / "capi"
    libs = sorted(capi.glob("libonnxruntime.so*")) + sorted(capi.glob("onnxruntime.dll"))
    return libs[0] if libs else None


def known_keys() -> frozenset | None:
    """The session config keys this interpreter's onnxruntime knows (None: no library to read them from)."""
    lib = _library()
    state = file_state(lib) if lib else None
    if state is None:
        return None
    entry = quantbench_home() / "config-keys" / f"{content_key([str(lib.resolve()), state, _SCAN])}.json"
    cached = read_cached_json(entry)
    if isinstance(cached, list) and all(isinstance(k, str) for k in cached):
        return frozenset(cached)
    with open(lib, "rb") as fh:
        keys = library_keys(fh.read())
    write_cache_entry(entry, keys, keep=8)
    return frozenset(keys)


def library_keys(data: bytes) -> list:
    """The session config keys an onnxruntime library's bytes hold (whole strings, and INLINED keys by their head)."""
    return sorted({m.decode() for m in _KEY.findall(data)} | {k for k in INLINED if k[:16].encode() in data})


def check_config_keys(entries, where: str) -> None:
    """Refuse a session config key of onnxruntime's own families that onnxruntime does not know, naming the nearest
    known one; `where`: what the message opens with (the option or file that gave the key)."""
    keys = [k for k in entries if str(k).startswith(FAMILIES)]
    known = known_keys() if keys else None
    for key in keys:
        if known and key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else "; see onnxruntime_session_options_config_keys.h"
            raise UserError(f"{where}: onnxruntime has no session config key {key!r}{hint}")
