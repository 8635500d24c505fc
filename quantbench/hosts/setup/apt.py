"""The machine's apt sources read, not changed: the Debian mirror and keyring the set-up fetches from, and a private
apt configuration for a single package."""

from __future__ import annotations

import os
import re
from pathlib import Path

from quantbench.hosts.setup.programs import SetupError


DEBIAN_SUITES = {"buster", "bullseye", "bookworm", "trixie", "forky", "sid", "stable", "testing", "unstable",
                 "oldstable"}
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _deb822_entries(text: str) -> list[dict]:
    entries = []
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        entries.append({"types": fields.get("types", "").split(), "uris": fields["uris"].split(),
                        "suites": fields.get("suites", "").split(), "components": fields.get("components", "").split(),
                        "signed_by": fields.get("signed-by", "")})
    return entries


def _one_line_entries(text: str) -> list[dict]:
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        opts = ""
        m = re.match(r"^(deb|deb-src)\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = m.group(2) or ""
        signed = re.search(r"signed-by=(\S+?)[\s\]]", opts + " ")
        entries.append({"types": [m.group(1)], "uris": [m.group(3)], "suites": [m.group(4)],
                        "components": m.group(5).split(), "signed_by": signed.group(1) if signed else ""})
    return entries


def apt_entries(etc: Path = Path("/etc/apt")) -> list[dict]:
    """Every enabled apt source of the machine (one-line .list and deb822 .sources files)."""
    out = []
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list")) + \
        sorted((etc / "sources.list.d").glob("*.sources"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        out += _deb822_entries(text) if f.suffix == ".sources" else _one_line_entries(text)
    return out


def debian_mirror(etc: Path = Path("/etc/apt")) -> tuple[str, str]:
    """(mirror URI, keyring) of the machine's Debian archive, read from its apt sources.

    The mirror is never hard-coded: it is the entry serving a Debian release suite
    (not -security/-updates/-backports) with the main component.
    """
    override = os.environ.get("QUANTBENCH_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/"), DEFAULT_KEYRING
    for entry in apt_entries(etc):
        if "deb" not in entry["types"] or "main" not in entry["components"]:
            continue
        if any(s in DEBIAN_SUITES for s in entry["suites"]):
            keyring = entry["signed_by"] if entry["signed_by"].startswith("/") else DEFAULT_KEYRING
            return entry["uris"][0].rstrip("/"), keyring
    raise SetupError(f"{etc}: no Debian archive (a bookworm/trixie suite with component main) in the apt "
                     "sources; set QUANTBENCH_DEBIAN_MIRROR to a Debian mirror URI")


def apt_options(apt_dir: Path) -> list[str]:
    opts = [f"-o=Dir::Etc::SourceList={apt_dir / 'sources.list'}",
            f"-o=Dir::Etc::SourceParts={apt_dir / 'sources.list.d'}",
            f"-o=Dir::Etc::Preferences={apt_dir / 'preferences'}",
            f"-o=Dir::Etc::PreferencesParts={apt_dir / 'preferences.d'}",
            f"-o=Dir::State::Lists={apt_dir / 'lists'}",
            f"-o=Dir::Cache={apt_dir / 'cache'}",
            "-o=APT::Get::List-Cleanup=0",
            "-o=Acquire::Languages=none"]
    if os.geteuid() == 0:
        opts.append("-o=APT::Sandbox::User=root")  # the private folders are not readable by _apt
    return opts
