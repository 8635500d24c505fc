"""The option groups every entry point shares, as small typed values: the CLI builds them once from its flags
(quantbench.cli.groups), a Python caller passes them to quantbench's functions (quantbench.api), and the library
below takes their fields as parameters. Each default here is the command line's default.

- Fleet: the hosts a command runs or reads, and the hosts file naming them.
- Fixtures: the evaluation labels and images, their split, a limit, a sidecar overriding the variants' recipe.
- Session: the onnxruntime session options given for every host (only those given: each host supplies the rest).
- Results: the results folder (tables under its tables/), one name on every command.
- Output: progress bars, quiet, verbose, JSON.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import ParameterError
from quantbench.inputs.configkeys import check_entries

RESULTS = "results"
TABLES = "tables"


def is_path(value) -> bool:
    """A file or folder name a caller may give: text or a path object (not bytes, not a number)."""
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


def check_path(name: str, value, optional: bool = True) -> None:
    """`value` (parameter `name`) is a path, or None where `optional`: ParameterError otherwise."""
    if not (value is None and optional) and not is_path(value):
        raise ParameterError(name, "must be a file or folder name (str or pathlib.Path)", value)


def check_text(name: str, value, optional: bool = True) -> None:
    """`value` is text, or None where `optional`."""
    if not (value is None and optional) and not isinstance(value, str):
        raise ParameterError(name, "must be text", value)


def check_whole(name: str, value, optional: bool = True) -> None:
    """`value` is a whole number (not a bool, not text), or None where `optional`."""
    if not (value is None and optional) and (isinstance(value, bool) or not isinstance(value, int)):
        raise ParameterError(name, "must be a whole number", value)


def check_group(name: str, value, group: type) -> None:
    """A parameter taking an option group (`fleet=Fleet(...)`) got one: a bare string there (`run(None, 'x86')`)
    is a ParameterError naming the group to build, not an AttributeError from deep inside."""
    if not isinstance(value, group):
        raise ParameterError(name, f"must be a {group.__name__}(...), e.g. {group.__name__}{_EXAMPLE[group.__name__]}",
                             value)


def check_groups(**groups) -> None:
    """Each option-group parameter (fleet=, fixtures=, session=, results=, output=) holds its group."""
    for name, value in groups.items():
        check_group(name, value, _GROUPS[name])


def variant_list(variants):
    """The variants a caller named: None, one path (a str is one variant, not its characters) or a list of them."""
    if variants is None or is_path(variants):
        return variants if variants is None else [variants]
    if isinstance(variants, (list, tuple)) and all(is_path(v) or hasattr(v, "variant_id") or hasattr(v, "path")
                                                    for v in variants):
        return list(variants)
    raise ParameterError("variants", "must be a variants folder or .onnx file, or a list of them", variants)


@dataclass(frozen=True)
class Fleet:
    """hosts: comma-separated host names (or a list); hosts_file: the TOML hosts file (None: ./quantbench.toml)."""

    hosts: str | None = None
    hosts_file: str | None = None

    def __post_init__(self):
        if not (self.hosts is None or isinstance(self.hosts, str) or (
                isinstance(self.hosts, (list, tuple)) and all(isinstance(h, str) for h in self.hosts))):
            raise ParameterError("hosts", "must be comma-separated host names or a list of them, e.g. 'x86,pi'",
                                 self.hosts)
        check_path("hosts_file", self.hosts_file)

    def names(self) -> str | None:
        """The hosts as the comma-separated text the host registry parses."""
        if self.hosts is None or isinstance(self.hosts, str):
            return self.hosts
        return ",".join(str(h) for h in self.hosts)


@dataclass(frozen=True)
class Fixtures:
    """labels: COCO JSON or CSV labels (None: the labels the variants were calibrated with); images: their folder;
    split: train, val, eval or all; limit: at most N images of the split; sidecar: a sidecar JSON file overriding
    the variants' own recipe."""

    labels: str | None = None
    images: str | None = None
    split: str = "eval"
    limit: int | None = None
    sidecar: str | None = None

    def __post_init__(self):
        for name in ("labels", "images", "sidecar"):
            check_path(name, getattr(self, name))
        if not isinstance(self.split, str):
            raise ParameterError("split", "must be a split name: train, val, eval or all", self.split)
        check_whole("limit", self.limit)


@dataclass(frozen=True)
class Session:
    """Session options for every host: config entries (KEY -> VALUE), graph optimisation level, intra-op threads,
    execution providers in priority order, and whether a requested provider that ran no node is refused."""

    config: dict = field(default_factory=dict)
    graph_opt: str | None = None
    threads: int | None = None
    providers: tuple | None = None
    require_providers: bool = False

    def __post_init__(self):
        """The config entries checked as the command line checks them (inputs/configkeys.check_entries): a mapping of
        keys onnxruntime knows to one-line values; the session options' types."""
        if not isinstance(self.config, Mapping):
            raise ParameterError("config", "must map session config keys to values, e.g. "
                                           "{'session.x64quantprecision': '1'}", self.config)
        object.__setattr__(self, "config", check_entries(dict(self.config), "Session config"))
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)):
            raise ParameterError("threads", "must be a whole number of threads", self.threads)
        if self.providers is not None and (isinstance(self.providers, str) or not all(
                isinstance(p, str) for p in self.providers)):
            raise ParameterError("providers", "must be a list of execution provider names", self.providers)

    def overrides(self) -> dict:
        """The session overrides these options give: only the ones set, each host's own session has the rest."""
        out = {"config_entries": dict(self.config)}
        if self.graph_opt is not None:
            out["graph_optimization_level"] = self.graph_opt
        if self.threads is not None:
            if self.threads < 1:
                raise ParameterError("threads", "must be at least 1", self.threads)
            out["intra_op_num_threads"] = self.threads
        if self.providers is not None:
            if not list(self.providers):
                raise ParameterError("providers", "name at least one, e.g. CPUExecutionProvider")
            out["providers"] = list(self.providers)
        return out


@dataclass(frozen=True)
class Results:
    """The results folder (variants/, tables/, releases/, report.md); `tables_folder` places the tables elsewhere
    (the command line's deprecated tables-folder option), its parent then holding what sits beside them."""

    root: str = RESULTS
    tables_folder: str | None = None

    def __post_init__(self):
        check_path("root", self.root, optional=False)
        check_path("tables_folder", self.tables_folder)

    @property
    def folder(self) -> Path:
        return Path(self.tables_folder).parent if self.tables_folder else Path(self.root)

    @property
    def tables(self) -> Path:
        return Path(self.tables_folder) if self.tables_folder else Path(self.root) / TABLES


@dataclass(frozen=True)
class Output:
    """progress: progress bars (None: only when stderr is a terminal, as on the command line); quiet: no summary;
    verbose: library warnings in full; json: the summary as JSON."""

    progress: bool | None = None
    quiet: bool = False
    verbose: int = 0
    json: bool = False

    def __post_init__(self):
        for name in ("progress", "quiet", "json"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "progress" and value is None):
                raise ParameterError(name, "must be True or False", value)
        check_whole("verbose", self.verbose, optional=False)

    def bars(self) -> bool:
        """Whether progress bars are drawn."""
        if self.progress is not None:
            return bool(self.progress and not self.quiet)
        try:
            return sys.stderr.isatty() and not self.quiet
        except (AttributeError, ValueError):
            return False


_EXAMPLE = {"Fleet": "('x86,pi')", "Fixtures": "(labels='labels.json')", "Session": "(threads=1)",
            "Results": "('results')", "Output": "(quiet=True)", "Gates": "(gate='decision')"}
_GROUPS = {"fleet": Fleet, "fixtures": Fixtures, "session": Session, "results": Results, "output": Output}
