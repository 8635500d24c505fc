"""`quantbench.release(...)` and `quantbench.verify(...)`: write a release record from the results folder (the
`release` command), check a release folder or archive (the `verify` command)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.store import lazy
from quantbench.api.options import Fleet, Results, check_group, check_groups, check_path, check_whole
from quantbench.errors import ParameterError
from quantbench.release.archive import verify_archive
from quantbench.release.publish import publish_release
from quantbench.release.record import ReleaseResult, flips_text
from quantbench.release.verify import FAIL, NOT_RETAINED, Check, verify as verify_folder
from quantbench.inputs.variantdir import load_variants
from quantbench.textfmt import text_table

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")


@dataclass
class Release:
    """A release (release.publish.ReleaseResult: `.result`): its folder, record, archive (file, sha256) or None;
    `refused` with the release keys already naming another artifact (`collisions`): nothing was written."""

    tag: str
    result: ReleaseResult

    @property
    def refused(self) -> bool:
        """Whether the release was refused: its release keys already name another artifact, nothing written."""
        return bool(self.result.refused)

    @property
    def folder(self) -> Path:
        """The release's folder, results/releases/TAG/."""
        return Path(self.result.folder)

    @property
    def record(self) -> dict:
        """release.json's content: variants, hosts, hashes, byte classes, release keys."""
        return self.result.record

    def targets(self) -> "pa.Table":
        """What the release vouches for, per variant and host, to look a deployed artifact up by its hashes.

        Returns
        -------
        pyarrow.Table
            One row per variant x host of the record: hashes, fingerprint, byte class, release key.
        """
        rows = [{"variant": v["name"], "variant_id": v["variant_id"], "raw_sha256": v["raw_sha256"],
                 "semantic_sha256": v["semantic_sha256"], "host": t["host"], "fingerprint_id": t["fingerprint_id"],
                 "byte_class": t["byte_class"], "release_key": t["release_key"]}
                for v in (self.record or {}).get("variants", []) for t in v["targets"]]
        return pa.Table.from_pylist(rows, schema=pa.schema([(k, pa.string()) for k in (
            "variant", "variant_id", "raw_sha256", "semantic_sha256", "host", "fingerprint_id", "byte_class",
            "release_key")]))


    def targets_text(self) -> str:
        """The record's variant x host rows as the command prints them.

        Returns
        -------
        str
            Short hashes, byte class with its hosts, flips against fp32 on the same host, release key.
        """
        rows = [[v["name"], v["raw_sha256"][:12], v["semantic_sha256"][:12], t["host"], t["fingerprint_id"][:12],
                 f"{t['byte_class']} ({','.join(t['byte_class_hosts'])})", flips_text(v, t), t["release_key"][:12]]
                for v in (self.record or {}).get("variants", []) for t in v["targets"]]
        return text_table(["variant", "raw", "semantic", "host", "fingerprint", "byte class",
                           "flips vs fp32 (same host)", "release key"], rows, rule=True)


def release(tag: str, results: Results = Results(), hosts=None, retain: bool = True, variants=None,
            archive=None, force: bool = False) -> Release:
    """Write a release record: `results`/releases/TAG/ (tables, report, release.json) with its release keys
    registered, so a deployed artifact is traced to what was measured (`verify` re-checks it).

    Parameters
    ----------
    tag : str
        The release's name; results/releases/TAG/ must not exist yet.
    results : Results
        The results folder released.
    hosts : str or list of str, optional
        The hosts to include, comma-separated or a list (None: every host with results for the variants).
    retain : bool
        Copy the variant ONNX files into the release (False: recorded as deliberately not retained).
    variants : str or path, optional
        A variants folder with its index.json (None: the latest calibrate output).
    archive : str or path, optional
        Also write one .tar.gz ("" for results/releases/TAG.tar.gz; None: none).
    force : bool
        Replace a file already at `archive` (else refused, nothing written).

    Returns
    -------
    Release
        Its folder, record and archive; `refused` when its release keys already name another artifact
        (`collisions`), nothing written.
    """
    if not isinstance(tag, str):
        raise ParameterError("tag", "must be the release's name as text, e.g. 'v1.0'", tag)
    check_group("results", results, Results)
    check_path("variants", variants)
    check_path("archive", archive)
    if not (hosts is None or isinstance(hosts, str) or (
            isinstance(hosts, (list, tuple)) and all(isinstance(h, str) for h in hosts))):
        raise ParameterError("hosts", "must be comma-separated host names or a list of them", hosts)
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()] or None
    chosen = load_variants(variants) if variants else None
    res = publish_release(tag, results_dir=results.folder, hosts=list(hosts) if hosts else None, retain=retain,
                          variants=chosen, archive=archive, force=force)
    return Release(tag, res)


@dataclass
class Verification:
    """The checks of a release (release.verify.Check: check, item, status, detail) and whether all passed."""

    release: str
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """Whether no check failed (an artifact deliberately not retained is no failure)."""
        return not any(c.status == FAIL for c in self.checks)

    @property
    def failed(self) -> int:
        """How many checks failed."""
        return sum(c.status == FAIL for c in self.checks)

    @property
    def not_retained(self) -> int:
        """How many artifacts the release deliberately did not retain."""
        return sum(c.status == NOT_RETAINED for c in self.checks)

    def text(self) -> str:
        """The checks as the command prints them.

        Returns
        -------
        str
        """
        return text_table(["check", "item", "status", "detail"],
                          [[c.check, c.item, c.status, c.detail] for c in self.checks], rule=True)

    def table(self) -> "pa.Table":
        """The checks as a table, to filter the failures.

        Returns
        -------
        pyarrow.Table
            One row per check: check, item, status, detail.
        """
        return pa.Table.from_pylist([dataclasses.asdict(c) for c in self.checks],
                                    schema=pa.schema([(k, pa.string()) for k in ("check", "item", "status", "detail")]))


def verify(release: str, host: str | None = None, sample: int = 4, fleet: Fleet = Fleet(),
           results: Results = Results(), registry: bool = True) -> Verification:
    """Check a release folder or archive: re-hash the retained artifacts and re-read every table against its
    recorded hash, so a release altered after the fact is caught; with `host`, re-run a sample there.

    Parameters
    ----------
    release : str or path
        A release folder (results/releases/v1) or archive (.tar.gz, checked member by member, unpacked only into a
        private temporary folder).
    host : str, optional
        Re-run `sample` fixtures per variant on this host (one the release recorded) and compare output hashes.
    sample : int
        Fixtures per variant re-run on `host`.
    fleet : Fleet
        The hosts file defining `host`.
    results : Results
        The results folder whose releases index vouches for release.json.
    registry : bool
        Check the releases index (False: the release was copied without it; then nothing vouches for
        release.json itself).

    Returns
    -------
    Verification
        Every check (check, item, status, detail); `passed` when none failed.
    """
    check_path("release", release, optional=False)
    check_whole("sample", sample, optional=False)
    check_groups(fleet=fleet, results=results)
    check = verify_archive if Path(release).is_file() else verify_folder
    checks = check(release, host=host, sample=sample, hosts_file=fleet.hosts_file, registry=registry,
                   results_dir=results.folder)
    return Verification(str(release), list(checks))
