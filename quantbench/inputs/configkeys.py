"""The session config keys onnxruntime knows, so a misspelt one (`session.x64quantprecison=1`) is refused with
the nearest known key instead of being passed on, ignored by onnxruntime and shown as applied.

onnxruntime keeps its keys (onnxruntime_session_options_config_keys.h: `session.*`, `optimization.*`, `mlas.*`)
as strings in its library; they are read from this interpreter's onnxruntime library once per install (cached
by the library's file state under ~/.cache/quantbench/config-keys). Any other key is refused too (`zzz.unknown`,
`SESSION.X64QUANTPRECISION`: keys are case-sensitive), a session *option* given as an entry with the parameter
that sets it, except the `ep.*` family (a provider's own: its list lives in the provider). One value per key,
never empty, on one line: onnxruntime would take the last, or an empty string, without a word.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import content_key, file_state, read_cached_json, write_cache_entry

FAMILIES = ("session.", "optimization.", "mlas.")
#: the family of a provider's own keys, not checked (its list lives in the provider)
PROVIDER_FAMILY = "ep."
#: session options onnxruntime sets as SessionOptions fields, not config entries -> the parameter that sets them
#: for every host (None: a host's own, `NAME+KEY=VALUE` or the hosts file)
SESSION_OPTIONS = {"intra_op_num_threads": "threads", "inter_op_num_threads": None,
                   "graph_optimization_level": "graph_opt", "execution_mode": None, "providers": "providers",
                   "batch": None}
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


def _option_hint(key: str) -> str:
    """Where a session option given as a config entry goes instead."""
    param = SESSION_OPTIONS[key]
    flag = f"{flag_mark(param)} for every host, or " if param else ""
    return (f"{key} is a session option, not a session config entry: set it with {flag}a host's own "
            f"NAME+{key}=VALUE (or its hosts-file entry)")


def library_keys(data: bytes) -> list:
    """The session config keys an onnxruntime library's bytes hold (whole strings, and INLINED keys by their head)."""
    return sorted({m.decode() for m in _KEY.findall(data)} | {k for k in INLINED if k[:16].encode() in data})


def check_config_keys(entries, where: str) -> None:
    """Refuse a session config key this onnxruntime does not know (any key but a provider's `ep.*`), naming the
    nearest known one (case included) or, for a session option given as an entry, the parameter that sets it;
    `where`: what the message opens with (the option or file that gave the key)."""
    keys = [str(k) for k in entries]
    for key in keys:
        if key in SESSION_OPTIONS:
            raise UserError(f"{where}: {_option_hint(key)}")
    keys = [k for k in keys if not k.startswith(PROVIDER_FAMILY)]
    known = known_keys() if keys else None
    for key in keys:
        if known and key not in known:
            lower = {k.lower(): k for k in known}
            near = [lower[key.lower()]] if key.lower() in lower else \
                difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else "; see onnxruntime_session_options_config_keys.h"
            raise UserError(f"{where}: onnxruntime has no session config key {key!r}{hint}")


def check_entries(pairs, where: str) -> dict:
    """Session config entries given as (KEY, VALUE) pairs (or a dict), checked: str keys and values, a value on
    one line and not empty, one value per key, every key one onnxruntime knows (check_config_keys). `where`: the
    parameter or file that gave them. Returns them as a dict, in the order given."""
    items = list(pairs.items()) if isinstance(pairs, dict) else list(pairs)
    out: dict = {}
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str) or not key.strip():
            raise UserError(f"{where}: session config entries map KEY to VALUE strings, e.g. "
                            f"session.x64quantprecision=1; got {key!r}={value!r:.60}")
        if any(c in key + value for c in "\n\r\x00") or key.strip() != key:
            raise UserError(f"{where} {key!r:.60}: a config entry is one line, KEY=VALUE without spaces around KEY")
        if not value.strip():
            raise UserError(f"{where} {key}: empty value; give one, e.g. {key}=1")
        if key in out and out[key] != value:
            raise UserError(f"{where} {key}: given twice ({out[key]!r}, then {value!r}); give one value per key")
        out[key] = value
    check_config_keys(out, where)
    return out
