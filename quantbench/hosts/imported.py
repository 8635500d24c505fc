"""`imported` hosts: results produced by quantbench on a machine the workbench cannot reach.

`quantbench run --hosts local --export pi.qbr` on the air-gapped machine writes one
file: an uncompressed tar holding manifest.json and one Parquet file per table
(fixtures, models, hosts, outputs) restricted to the run's hosts, variants and
fixtures. Here, a host `airgap = { kind = "imported", file = "pi.qbr" }` merges it
into the local tables by content: rows keep their fingerprint, run_key and hashes,
only the host name becomes the entry's name (and kind `imported`). Merging twice
changes nothing (table parts are content-addressed and de-duplicated by key).

Nothing in the file is taken on trust: before anything is merged every fixture and
output tensor is re-hashed, every run_key, session key and fingerprint id is
recomputed (with the runner's and worker's own functions) and every reference
between the tables is checked; the first bad record is a one-line UserError naming
the file. A file whose results cover none of the requested runs is an error too.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench import SCHEMA_VERSION
from quantbench.store import lazy
from quantbench.store import arrowrows, partread, partwrite, tableschema
from quantbench.store.resultpaths import TABLES_DIR
from quantbench.errors import ParameterError, UserError, flag_mark, marked
from quantbench.fsutil import (MAX_EXPANSION, atomic_path, canonical_json, check_new_file, expansion_limit,
                               regular_file, sha256_bytes, sha256_file)
from quantbench.hosts.keys import hosts_row, run_key, session_key
from quantbench.hosts.shards import check_files, check_fixture_set, files_of
from quantbench.worker import fingerprint_id
from quantbench.tensorcode import tensor_from_bytes, tensor_sha256

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # pyarrow loads on first use (lazy.py)
    pa, pc, pq = lazy.module("pyarrow"), lazy.module("pyarrow.compute"), lazy.module("pyarrow.parquet")

FORMAT = "quantbench-results"
TABLES = ("fixtures", "models", "hosts", "outputs")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def export_results(path, hosts: list[str], variant_ids: list[str] | None = None,
                   fixture_ids: list[str] | None = None, tables_root=TABLES_DIR, shard: dict | None = None,
                   as_host: str | None = None, force: bool = False) -> dict:
    """Write the named hosts' results (and the fixtures/models/hosts rows they need) to one file, atomically.

    `shard`: the run's shard record (shards.select), carried in the manifest; `as_host`: the name the one
    host's results are exported under (the local host of an arm64 machine need not be called x86). A file already
    at `path` is an error unless `force` (fsutil.check_new_file). Returns the manifest. Same tables in, same bytes out.
    """
    if as_host is not None and len(hosts) != 1:
        raise ParameterError("as_host", f"names one host, and the run has {len(hosts)} ({', '.join(hosts)})", as_host)
    check_new_file(path, "export", force)
    root = Path(tables_root)
    flt = {"host": list(hosts)}
    if variant_ids is not None:
        flt["variant_id"] = list(variant_ids)
    if fixture_ids is not None:
        flt["fixture_id"] = list(fixture_ids)
    outputs = partread.read("outputs", root=root, filter=flt)
    if outputs.num_rows == 0:
        raise UserError(f"{flag_mark('export')} {path}: no results for host(s) {', '.join(hosts)} in {root}; nothing to export")
    fids = sorted(set(outputs.column("fixture_id").to_pylist()))
    vids = sorted(set(outputs.column("variant_id").to_pylist()))
    fps = sorted(set(outputs.column("fingerprint_id").to_pylist()))
    parts = {
        "fixtures": partread.read("fixtures", root=root, filter={"fixture_id": fids}),
        "models": partread.read("models", root=root, filter={"variant_id": vids}),
        "hosts": partread.read("hosts", root=root, filter={"fingerprint_id": fps, "host": list(hosts)}),
        "outputs": outputs,
    }
    if as_host is not None:
        outputs = parts["outputs"] = _set_column(outputs, "host", as_host)
        parts["hosts"] = _set_column(parts["hosts"], "host", as_host)
    data = {f"{name}.parquet": _parquet(arrowrows.to_arrow(name, parts[name])) for name in TABLES}
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "hosts": sorted(set(outputs.column("host").to_pylist())),
                "rows": {k: v.num_rows for k, v in parts.items()}, "variants": vids, "fixtures": len(fids),
                "sha256": {member: sha256_bytes(b) for member, b in data.items()}}
    if shard is not None:
        manifest["shard"] = shard
    path = Path(path)
    with atomic_path(path) as tmp:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, "manifest.json", (canonical_json(manifest) + "\n").encode())
            for member, b in data.items():
                _add(tar, member, b)
    return manifest


#: (path, size, mtime, inode) -> (file SHA-256, checked manifest, tables): the runner reads one file up to
#: four times (ready, check, merge's check, import); it is hashed and checked once while unchanged
_VERIFIED: dict[tuple, tuple[str, dict, dict]] = {}
_KEEP = 8


def read_export(path) -> tuple[dict, dict[str, pa.Table]]:
    """(manifest, {table: arrow table}) of an export file whose every hash was recomputed and matched;
    a bad or forged file is a UserError naming it and its first bad record."""
    return _verified(path)[1:]


def _verified(path) -> tuple[str, dict, dict[str, pa.Table]]:
    """(file SHA-256, manifest, tables) of a checked export file (see read_export)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: results file not found (write it with `quantbench run {flag_mark('export')} {path.name}` on the other machine)")
    regular_file(path, "results file (.qbr)")
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if key not in _VERIFIED:
            sha = sha256_file(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the results file ({exc})") from None
    if key not in _VERIFIED:
        manifest, out = _read_export(path)
        check_export(path, manifest, out)
        while len(_VERIFIED) >= _KEEP:  # the files of one host (its shards) stay checked; the oldest goes first
            _VERIFIED.pop(next(iter(_VERIFIED)))
        _VERIFIED[key] = (sha, manifest, out)
    return _VERIFIED[key]


def _read_export(path: Path) -> tuple[dict, dict[str, pa.Table]]:
    try:
        with tarfile.open(path, "r:") as tar:
            members = _checked_members(path, tar.getmembers())
            if "manifest.json" not in members:
                raise UserError(f"{path}: not a quantbench results export (no manifest.json)")
            _check_end(path, tar)
            manifest = json.loads(tar.extractfile(members["manifest.json"]).read())
            if not isinstance(manifest, dict):
                raise UserError(f"{path}: not a quantbench results export (its manifest.json is not an object)")
            if manifest.get("format") != FORMAT:
                raise UserError(f"{path}: not a quantbench results export (format {manifest.get('format')!r})")
            if manifest.get("schema_version") != SCHEMA_VERSION:
                raise UserError(f"{path}: schema version {manifest.get('schema_version')}, this quantbench reads {SCHEMA_VERSION}")
            sums = _member_sums(path, manifest)
            out = {}
            for name in TABLES:
                m = members.get(f"{name}.parquet")
                if m is None:
                    raise UserError(f"{path}: export lacks {name}.parquet")
                data = tar.extractfile(m).read()
                if sha256_bytes(data) != sums[m.name]:   # damaged bytes are never parsed
                    raise UserError(f"{path}: {m.name} does not have the SHA-256 its manifest records; the file was "
                                    "altered or damaged, nothing was imported")
                part = pq.ParquetFile(io.BytesIO(data))
                _check_rows(path, name, part.metadata.num_rows, manifest)   # from its footer, before a row is read
                out[name] = _as_exported(path, name, partread.read_bounded(part, expansion_limit(len(data))))
    except UserError:
        raise
    except partread.DecodedTooLarge:
        raise UserError(f"{path}: {name}.parquet decodes to more than {MAX_EXPANSION} times its {len(data)} bytes "
                        "(and 1 MiB); the file was altered or damaged, nothing was imported") from None
    except (tarfile.TarError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise UserError(f"{path}: not a readable quantbench results export ({exc})") from None
    return manifest, out


def _member_sums(path: Path, manifest: dict) -> dict:
    """{member: SHA-256} the manifest records for each table, or a UserError (an export made before member
    checksums is exported again: its bytes cannot be told from damaged ones)."""
    sums = manifest.get("sha256")
    want = {f"{name}.parquet" for name in TABLES}
    if not (isinstance(sums, dict) and set(sums) == want and all(isinstance(v, str) for v in sums.values())):
        raise UserError(f"{path}: its manifest records no SHA-256 for each table (an export of an older quantbench, "
                        "or altered); export it again with this quantbench, nothing was imported")
    return sums


def _check_end(path: Path, tar: tarfile.TarFile) -> None:
    """After the last member, nothing but the tar's end blocks, padded as tarfile writes them: bytes (or a second
    tar) appended after them are otherwise never read, and never noticed."""
    end = tar.offset   # where the end blocks start, once every member is read
    want = -(-(end + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE
    size = path.stat().st_size
    tail = b""
    if size == want:
        with open(path, "rb") as fh:
            fh.seek(end)
            tail = fh.read(want - end)
    if size != want or tail.count(0) != len(tail):
        raise UserError(f"{path}: data after the end of the export ({size - end} bytes after its last member, "
                        f"{want - end} expected); the file was altered or damaged, nothing was imported")


def _as_exported(path: Path, name: str, t: pa.Table) -> pa.Table:
    """One table of an export as export_results wrote it: no column its schema lacks (they were dropped without a
    word); else a UserError naming the file, the table and the columns."""
    extra = [c for c in t.column_names if c not in tableschema.schema(name).names]
    if extra:
        raise UserError(f"{path}: {name}.parquet has column(s) quantbench does not write: {', '.join(extra[:5])}; "
                        "the file is not an export of quantbench as it wrote it, nothing was imported")
    return arrowrows.to_arrow(name, t)


def _check_rows(path: Path, name: str, rows: int, manifest: dict) -> None:
    """A table holds the rows the manifest declares (its Parquet footer says how many, before a row is read):
    rows repeated inside a small file decode to gigabytes (560 KB of outputs repeated 100,000 times took 3.5 GB)."""
    declared = manifest.get("rows")
    want = declared.get(name) if isinstance(declared, dict) else None
    if type(want) is not int or rows != want:
        raise UserError(f"{path}: {name}.parquet holds {rows} rows, the manifest declares {want!r}; the file was "
                        "altered or damaged, nothing was imported")
    if name == "fixtures" and rows != manifest.get("fixtures"):
        raise UserError(f"{path}: fixtures.parquet holds {rows} rows, the manifest declares "
                        f"{manifest.get('fixtures')!r} fixtures; the file was altered or damaged, nothing was imported")


def _checked_members(path: Path, members: list) -> dict:
    """name -> member of an export holding only what export_results writes: each name once, a regular file."""
    allowed = {"manifest.json", *(f"{name}.parquet" for name in TABLES)}
    fail = "; the file was not written by `quantbench run --export` as it is, nothing was imported"
    seen: dict = {}
    for m in members:
        if not m.isfile():
            raise UserError(f"{path}: member {m.name} is not a regular file{fail}")
        if m.name in seen:
            raise UserError(f"{path}: member {m.name} appears more than once{fail}")
        seen[m.name] = m
    extra = sorted(set(seen) - allowed)
    if extra:
        shown = ", ".join(extra[:5]) + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
        raise UserError(f"{path}: member(s) quantbench does not write: {shown}{fail}")
    return seen


class _Bad(Exception):
    pass


def _tensor_hash(data, dtype, shape) -> str:
    if data is None:
        raise _Bad("has no tensor, so its hash cannot be checked")
    try:
        return tensor_sha256(tensor_from_bytes(data, dtype, shape))
    except (TypeError, ValueError) as exc:
        raise _Bad(f"tensor is not a {dtype} array of shape {shape} ({exc})") from None


def _rows(t: pa.Table, names, batch: int = 256):
    """Tuples of the named columns, a batch at a time (tensors are not all copied out at once)."""
    for b in t.select(list(names)).to_batches(max_chunksize=batch):
        yield from zip(*(b.column(i).to_pylist() for i in range(len(names))))


def check_export(path, manifest: dict, parts: dict[str, pa.Table]) -> None:
    """Recompute every tensor hash, run key, session key and fingerprint id the file claims.

    Raises a one-line UserError naming the file and the first bad record.
    """
    def bad(where: str, why: str):
        return UserError(f"{path}: {where}: {why}; the file was altered or damaged, nothing was imported")

    fixture_ids = _check_fixtures(parts["fixtures"], bad)
    variant_ids = set(parts["models"].column("variant_id").to_pylist())
    fingerprints = _check_hosts(parts["hosts"], bad)
    _check_outputs(parts["outputs"], fixture_ids, fingerprints, variant_ids, bad)


def _check_fixtures(fx: pa.Table, bad) -> set:
    """The fixture ids of the fixtures table, each the hash of its tensor; `bad(where, why)` makes the error."""
    fixture_ids, seen = set(), {}
    for i, (fid, pid, dtype, shape, data) in enumerate(_rows(fx, ("fixture_id", "preprocess_id", "dtype", "shape",
                                                                  "tensor"))):
        if seen.setdefault((fid, pid), i) != i:
            raise bad(f"fixtures row {i} (fixture {str(fid)[:12]})",
                      f"repeats row {seen[fid, pid]} (the same fixture and preprocessing)")
        try:
            got = _tensor_hash(data, dtype, shape)
        except _Bad as exc:
            raise bad(f"fixtures row {i} (fixture {str(fid)[:12]})", str(exc)) from None
        if got != fid:
            raise bad(f"fixtures row {i} (fixture {str(fid)[:12]})", f"input tensor hashes to {got[:12]}, not to its fixture_id")
        fixture_ids.add(fid)
    return fixture_ids


def _check_hosts(hosts: pa.Table, bad) -> set:
    """(host, fingerprint id) of each hosts row, the id the hash of its fingerprint and the columns read from it."""
    fingerprints = set()
    for i, row in enumerate(hosts.to_pylist()):
        where = f"hosts row {i} (host {row['host']}, fingerprint {str(row['fingerprint_id'])[:12]})"
        try:
            fp = json.loads(row["fingerprint"] or "")
            got = fingerprint_id(fp)
            want = hosts_row(row["host"], row["kind"], fp, got)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise bad(where, f"fingerprint is not a quantbench fingerprint ({type(exc).__name__})") from None
        if got != row["fingerprint_id"]:
            raise bad(where, f"fingerprint hashes to {got[:12]}, not to its fingerprint_id")
        for col in ("arch", "cpu", "isa_flags", "ort_version"):
            if want[col] != row[col]:
                raise bad(where, f"{col} {row[col]!r} disagrees with the fingerprint ({want[col]!r})")
        fingerprints.add((row["host"], got))
    return fingerprints


def _check_outputs(outputs: pa.Table, fixture_ids: set, fingerprints: set, variant_ids: set, bad) -> None:
    """Each outputs row: its session and run keys recomputed, what it names present in the other tables, its
    tensor hashing to its sha256."""
    cols = ("run_key", "host", "fingerprint_id", "session_key", "session_options", "variant_id", "fixture_id",
            "output_name", "dtype", "shape", "sha256", "tensor")
    skeys: dict = {}
    seen: dict = {}
    for i, (rk, host, fpid, skey, sopts, vid, fid, name, dtype, shape, sha, data) in enumerate(
            _rows(outputs, cols)):
        where = f"outputs row {i} (host {host}, fixture {str(fid)[:12]}, output {name})"
        if seen.setdefault((rk, host, name), i) != i:   # a row of the tables' key once (repeats decode for free)
            raise bad(where, f"repeats row {seen[rk, host, name]} (the same run, host and output)")
        if sopts not in skeys:
            try:
                skeys[sopts] = session_key(json.loads(sopts or ""))
            except (UserError, TypeError, ValueError):
                skeys[sopts] = None
        if skeys[sopts] != skey:
            raise bad(where, "session_key is not the hash of its session options")
        if rk != run_key(str(vid), str(fid), str(fpid), str(skey)):
            raise bad(where, "run_key is not the hash of its variant, fixture, fingerprint and session")
        if (host, fpid) not in fingerprints:
            raise bad(where, f"fingerprint {str(fpid)[:12]} of host {host} is not in the hosts table")
        if fid not in fixture_ids:
            raise bad(where, "its fixture is not in the fixtures table")
        if vid not in variant_ids:
            raise bad(where, f"variant {str(vid)[:12]} is not in the models table")
        try:
            got = _tensor_hash(data, dtype, shape)
        except _Bad as exc:
            raise bad(where, str(exc)) from None
        if got != sha:
            raise bad(where, f"output tensor hashes to {got[:12]}, not to its recorded sha256 {str(sha)[:12]}")


def _set_column(t: pa.Table, name: str, value) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array([value] * t.num_rows, t.schema.field(i).type))


def import_results(path, as_host: str, source_host: str | None = None, tables_root=TABLES_DIR,
                   entry: str | None = None) -> dict:
    """Merge one host's results from an export file into the local tables under the name `as_host`
    (`entry`: the imported host it was split from, when its files ran on several CPU models).

    Returns {"source_host", "run_keys", "rows", "fingerprint_ids"}.
    """
    sha, parts, source_host, out = _source(path, source_host)
    root = Path(tables_root)
    hrows = parts["hosts"].filter(pc.field("host") == source_host).to_pylist()
    for r in hrows:
        fp = json.loads(r["fingerprint"])
        fp["imported_from"] = {"host": r["host"], "kind": r["kind"], "file_sha256": sha,
                               **({"split_from": entry} if entry else {})}
        r.update(host=as_host, kind="imported", fingerprint=canonical_json(fp))
    partwrite.append("fixtures", parts["fixtures"], root=root)
    partwrite.append("models", parts["models"], root=root)
    partwrite.append("hosts", hrows, root=root)
    partwrite.append("outputs", _set_column(out, "host", as_host), root=root)
    held = set(zip(*(out.column(c).to_pylist() for c in ("fingerprint_id", "session_key", "variant_id", "fixture_id"))))
    return {"source_host": source_host, "run_keys": set(out.column("run_key").to_pylist()), "rows": out.num_rows,
            "held": held,
            "fingerprint_ids": sorted(set(out.column("fingerprint_id").to_pylist())),
            "session_keys": sorted(set(out.column("session_key").to_pylist()))}


def _source(path, source_host: str | None):
    """(file SHA-256, checked tables, source host, its outputs rows) of an export file."""
    sha, manifest, parts = _verified(path)
    hosts = manifest.get("hosts", [])
    if source_host is None:
        if len(hosts) != 1:
            raise UserError(f"{path}: holds hosts {', '.join(hosts)}; say which one with host = \"NAME\" in the hosts file")
        source_host = hosts[0]
    elif source_host not in hosts:
        raise UserError(f"{path}: has no host {source_host!r}; it holds {', '.join(hosts)}")
    return sha, parts, source_host, parts["outputs"].filter(pc.field("host") == source_host)


def held_results(options: dict, variant_ids) -> tuple[list[dict], list[dict]]:
    """(outputs rows with their tensors, hosts rows) of the source host of an imported host's files (`options`: its
    kind options) for the variants `variant_ids`; every file checked as a merge checks it, nothing merged."""
    files = files_of(options)
    check_files(files, read_export)
    outs: list = []
    hosts: list = []
    for f in files:
        _, parts, source, out = _source(f, options.get("host"))
        outs += out.filter(pc.is_in(out.column("variant_id"), value_set=pa.array(sorted(variant_ids)))).to_pylist()
        hosts += parts["hosts"].filter(pc.field("host") == source).to_pylist()
    return outs, hosts


def coverage(host: "ImportedHost", ctx) -> tuple[int, int, str]:
    """(requested results the file holds, requested results, why not all) for the runner's context."""
    outs = [_source(f, host.options.get("host"))[3] for f in files_of(host.options)]
    keys = {k for out in outs for k in out.column("run_key").to_pylist()}
    fps = sorted({f for out in outs for f in out.column("fingerprint_id").to_pylist()})
    skeys = {k for out in outs for k in out.column("session_key").to_pylist()}
    vids = {v for out in outs for v in out.column("variant_id").to_pylist()}
    want = have = 0
    for vi in ctx.variants:
        for fx in ctx.fixtures_for[vi.variant_id]:
            want += 1
            if any(run_key(vi.variant_id, fx.fixture_id, f, ctx.skey_of(host.name, vi)) in keys for f in fps):
                have += 1
    why = ""
    if not {ctx.skey_of(host.name, vi) for vi in ctx.variants} & skeys:
        why = " (the export was made under other session options)"
    elif not {vi.variant_id for vi in ctx.variants} & vids:
        why = " (it holds none of the requested variants)"
    return have, want, why


def check_coverage(host: "ImportedHost", ctx) -> tuple[int, int, str]:
    """coverage(), but an imported host holding none of the requested results is an error: it
    would otherwise sit in an equivalence class without a single measurement. Shards of other fixtures than the
    run's are an error too (shards.check_fixture_set)."""
    try:
        check_fixture_set(files_of(host.options), read_export, [fx.fixture_id for fx in ctx.fixtures])
    except UserError as exc:
        raise UserError(f"host {host.name}: {marked(exc)}") from None
    have, want, why = coverage(host, ctx)
    if want and not have:
        raise UserError(f"host {host.name}: {', '.join(files_of(host.options))}: its results cover none of the {want} "
                        f"requested runs{why}; export the same variants and fixtures on the other machine")
    return have, want, why


def tables_rows(manifest: dict):
    rows = manifest.get("rows")
    return rows.get("outputs", "?") if isinstance(rows, dict) else "?"


@dataclass
class ImportedHost:
    """Options: file (the export), host (which host inside the file, if it holds several)."""

    name: str
    options: dict = field(default_factory=dict)
    kind: str = "imported"
    model_by_path: bool = False
    #: its results are merged from the file (merge_imported), never run by a worker
    runs_workers = False
    #: no worker: nothing to trace, measure or fingerprint here (the ProcessHost attributes, all off)
    traces_instructions = False
    local_pid_memory = False
    caches_fingerprint = False

    def ready(self) -> tuple[bool, str]:
        ok, msg = self._ready()
        if not ok and self.options.get("split_from"):
            msg = (f"{self.options['split_from']} ran on several CPU models, one host each; this one, "
                   f"{self.options['cpu']}: {msg}")
        return ok, msg

    def _ready(self) -> tuple[bool, str]:
        files, said = files_of(self.options), []
        for f in map(Path, files):
            if not f.exists():
                return False, f"{f}: results file not found (write it with `quantbench run --export` on the other machine)"
            try:
                manifest, _ = read_export(f)
            except UserError as exc:
                return False, str(exc)
            shard = manifest.get("shard")
            part = f" (shard {shard.get('k')}/{shard.get('n')})" if isinstance(shard, dict) else ""
            said.append(f"{f.name}{part}: host(s) {', '.join(manifest.get('hosts', []))}, {tables_rows(manifest)} output rows")
        try:
            check_files(files, read_export)
        except UserError as exc:
            return False, marked(exc)
        return True, "imported " + "; ".join(said)

    def describe(self) -> str:
        return f"imported ({', '.join(files_of(self.options))})"

    def recorded_session(self) -> dict | None:
        """The one session the file's results of its host were made under (None: several, or unreadable): an
        imported host without session keys of its own runs under it (hosts.deploy.deployed_session)."""
        try:
            outs = [_source(f, self.options.get("host"))[3] for f in files_of(self.options)]
        except UserError:
            return None
        found = {s for out in outs for s in out.column("session_options").to_pylist()}
        return json.loads(found.pop()) if len(found) == 1 else None

    def latency_refusal(self) -> str | None:
        return "imported results carry no timings; measure on a local or ssh host"


def merge_imported(host: ImportedHost, ctx, summary) -> str:
    """Runner hook: merge the file, count how much of the requested run it covers."""
    files = files_of(host.options)
    check_files(files, read_export)
    have, want, why = check_coverage(host, ctx)
    fids: list = []
    summary.held = set()
    for f in files:
        res = import_results(f, host.name, host.options.get("host"), ctx.root, host.options.get("split_from"))
        fids += [x for x in res["fingerprint_ids"] if x not in fids]
        summary.held |= res["held"]
    fid = fids[0] if fids else ""
    summary.fingerprint_id = fid
    summary.imported = have
    summary.planned = want
    if have < want:
        summary.notes.append(f"host {host.name}: the imported file covers {have} of {want} requested results{why}")
    return fid


def _fingerprint_groups(host: ImportedHost) -> list[tuple[str, list]]:
    """[(CPU summary, files)] of an imported host's files grouped by the fingerprint(s) of their source host,
    sorted; [] when a file cannot be read (ready() says why)."""
    groups: dict = {}
    try:
        for f in files_of(host.options):
            _, parts, source, out = _source(f, host.options.get("host"))
            fps = tuple(sorted(set(out.column("fingerprint_id").to_pylist())))
            cpus = parts["hosts"].filter(pc.field("host") == source).column("cpu").to_pylist()
            groups.setdefault(fps, (" / ".join(sorted(set(cpus))), []))[1].append(f)
    except UserError:
        return []
    return sorted(((cpu, files) for fps, (cpu, files) in groups.items()), key=lambda g: (g[0], g[1]))


def split_by_fingerprint(specs: list, hosts: list) -> tuple[list, list, list]:
    """(specs, hosts, notes): an imported host whose files ran on more than one CPU model (fingerprint; a runner
    label can be Intel one time and AMD the next) becomes one host per fingerprint, NAME.1, NAME.2, ... (by CPU),
    each with its files: one host is one fingerprint, and each such host is checked (its shards) on its own."""
    out_specs, out_hosts, notes = [], [], []
    for spec, host in zip(specs, hosts):
        groups = _fingerprint_groups(host) if isinstance(host, ImportedHost) else []
        if len(groups) < 2:
            out_specs.append(spec)
            out_hosts.append(host)
            continue
        said = []
        for i, (cpu, files) in enumerate(groups, 1):
            opts = dict(spec.options, file=files, split_from=spec.name, cpu=cpu)
            out_specs.append(dataclasses.replace(spec, name=f"{spec.name}.{i}", options=opts))
            out_hosts.append(ImportedHost(f"{spec.name}.{i}", opts))
            said.append(f"{spec.name}.{i} = {cpu} ({', '.join(Path(f).name for f in files)})")
        notes.append(f"host {spec.name}: its files ran on {len(groups)} CPU models, so it is {len(groups)} hosts: "
                     + "; ".join(said))
    return out_specs, out_hosts, notes
