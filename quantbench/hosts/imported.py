"""`imported` hosts: results produced by quantbench on a machine the workbench cannot reach.

`quantbench run --hosts local --export pi.qbr` on the air-gapped machine writes one
file: an uncompressed tar holding manifest.json and one Parquet file per table
(fixtures, models, hosts, outputs) restricted to the run's hosts, variants and
fixtures. Here, a host `airgap = { kind = "imported", file = "pi.qbr" }` merges it
into the local tables by content: rows keep their fingerprint, run_key and hashes,
only the host name becomes the entry's name (and kind `imported`). Merging twice
changes nothing (table parts are content-addressed and de-duplicated by key).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quantbench import SCHEMA_VERSION, tables
from quantbench.assets import TABLES_DIR
from quantbench.errors import UserError
from quantbench.fsutil import atomic_path, canonical_json, sha256_file

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
                   fixture_ids: list[str] | None = None, tables_root=TABLES_DIR) -> dict:
    """Write the named hosts' results (and the fixtures/models/hosts rows they need) to one file, atomically.

    Returns the manifest. Same tables in, same bytes out.
    """
    root = Path(tables_root)
    flt = pc.field("host").isin(list(hosts))
    if variant_ids is not None:
        flt = flt & pc.field("variant_id").isin(list(variant_ids))
    if fixture_ids is not None:
        flt = flt & pc.field("fixture_id").isin(list(fixture_ids))
    outputs = tables.read("outputs", root=root, filter=flt)
    if outputs.num_rows == 0:
        raise UserError(f"--export {path}: no results for host(s) {', '.join(hosts)} in {root}; nothing to export")
    fids = sorted(set(outputs.column("fixture_id").to_pylist()))
    vids = sorted(set(outputs.column("variant_id").to_pylist()))
    fps = sorted(set(outputs.column("fingerprint_id").to_pylist()))
    parts = {
        "fixtures": tables.read("fixtures", root=root, filter=pc.field("fixture_id").isin(fids)),
        "models": tables.read("models", root=root, filter=pc.field("variant_id").isin(vids)),
        "hosts": tables.read("hosts", root=root, filter=pc.field("fingerprint_id").isin(fps) & pc.field("host").isin(list(hosts))),
        "outputs": outputs,
    }
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "hosts": sorted(set(outputs.column("host").to_pylist())),
                "rows": {k: v.num_rows for k, v in parts.items()}, "variants": vids, "fixtures": len(fids)}
    path = Path(path)
    with atomic_path(path) as tmp:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, "manifest.json", (canonical_json(manifest) + "\n").encode())
            for name in TABLES:
                _add(tar, f"{name}.parquet", _parquet(tables.to_arrow(name, parts[name])))
    return manifest


def read_export(path) -> tuple[dict, dict[str, pa.Table]]:
    """(manifest, {table: arrow table}) of an export file; a bad file is a UserError naming it."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: results file not found (write it with `quantbench run --export {path.name}` on the other machine)")
    try:
        with tarfile.open(path, "r:") as tar:
            members = {m.name: m for m in tar.getmembers()}
            if "manifest.json" not in members:
                raise UserError(f"{path}: not a quantbench results export (no manifest.json)")
            manifest = json.loads(tar.extractfile(members["manifest.json"]).read())
            if manifest.get("format") != FORMAT:
                raise UserError(f"{path}: not a quantbench results export (format {manifest.get('format')!r})")
            if manifest.get("schema_version") != SCHEMA_VERSION:
                raise UserError(f"{path}: schema version {manifest.get('schema_version')}, this quantbench reads {SCHEMA_VERSION}")
            out = {}
            for name in TABLES:
                m = members.get(f"{name}.parquet")
                if m is None:
                    raise UserError(f"{path}: export lacks {name}.parquet")
                out[name] = tables.to_arrow(name, pq.read_table(io.BytesIO(tar.extractfile(m).read())))
    except UserError:
        raise
    except (tarfile.TarError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise UserError(f"{path}: not a readable quantbench results export ({exc})") from None
    return manifest, out


def _set_column(t: pa.Table, name: str, value) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array([value] * t.num_rows, t.schema.field(i).type))


def import_results(path, as_host: str, source_host: str | None = None, tables_root=TABLES_DIR) -> dict:
    """Merge one host's results from an export file into the local tables under the name `as_host`.

    Returns {"source_host", "run_keys", "rows", "fingerprint_ids"}.
    """
    manifest, parts = read_export(path)
    hosts = manifest.get("hosts", [])
    if source_host is None:
        if len(hosts) != 1:
            raise UserError(f"{path}: holds hosts {', '.join(hosts)}; say which one with host = \"NAME\" in the hosts file")
        source_host = hosts[0]
    elif source_host not in hosts:
        raise UserError(f"{path}: has no host {source_host!r}; it holds {', '.join(hosts)}")
    root = Path(tables_root)
    sha = sha256_file(path)
    out = parts["outputs"].filter(pc.field("host") == source_host)
    hrows = parts["hosts"].filter(pc.field("host") == source_host).to_pylist()
    for r in hrows:
        fp = json.loads(r["fingerprint"])
        fp["imported_from"] = {"host": r["host"], "kind": r["kind"], "file_sha256": sha}
        r.update(host=as_host, kind="imported", fingerprint=canonical_json(fp))
    tables.append("fixtures", parts["fixtures"], root=root)
    tables.append("models", parts["models"], root=root)
    tables.append("hosts", hrows, root=root)
    tables.append("outputs", _set_column(out, "host", as_host), root=root)
    return {"source_host": source_host, "run_keys": set(out.column("run_key").to_pylist()), "rows": out.num_rows,
            "fingerprint_ids": sorted(set(out.column("fingerprint_id").to_pylist())),
            "session_keys": sorted(set(out.column("session_key").to_pylist()))}


@dataclass
class ImportedHost:
    """Options: file (the export), host (which host inside the file, if it holds several)."""

    name: str
    options: dict = field(default_factory=dict)
    kind: str = "imported"
    model_by_path: bool = False

    def ready(self) -> tuple[bool, str]:
        f = Path(self.options["file"])
        if not f.exists():
            return False, f"{f}: results file not found (write it with `quantbench run --export` on the other machine)"
        try:
            manifest, _ = read_export(f)
        except UserError as exc:
            return False, str(exc)
        return True, f"imported {f.name}: host(s) {', '.join(manifest.get('hosts', []))}, {manifest['rows']['outputs']} output rows"

    def describe(self) -> str:
        return f"imported ({self.options['file']})"


def merge_imported(host: ImportedHost, ctx, summary) -> str:
    """Runner hook: merge the file, count how much of the requested run it covers."""
    from quantbench.hosts.runner import run_key

    res = import_results(host.options["file"], host.name, host.options.get("host"), ctx.root)
    fid = res["fingerprint_ids"][0] if res["fingerprint_ids"] else ""
    summary.fingerprint_id = fid
    want = 0
    have = 0
    for vi in ctx.variants:
        for fx in ctx.fixtures_for[vi.variant_id]:
            want += 1
            if any(run_key(vi.variant_id, fx.fixture_id, f, ctx.skey) in res["run_keys"] for f in res["fingerprint_ids"]):
                have += 1
    summary.imported = have
    summary.planned = want
    if have < want:
        why = ""
        if ctx.skey not in res["session_keys"]:
            why = " (the export was made under other session options)"
        summary.notes.append(f"host {host.name}: the imported file covers {have} of {want} requested results{why}")
    return fid
