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
    """The hosts a command runs on: one group, so every command names them the same way.

    Parameters
    ----------
    hosts : str or list of str, optional
        Comma-separated host names (``"pi,x86"``) or a list of them; None: the command's default.
    hosts_file : str, optional
        The TOML hosts file defining hosts beyond the presets (None: ./quantbench.toml).
    """

    hosts: str | None = None
    hosts_file: str | None = None

    def __post_init__(self):
        if not (self.hosts is None or isinstance(self.hosts, str) or (
                isinstance(self.hosts, (list, tuple)) and all(isinstance(h, str) for h in self.hosts))):
            raise ParameterError("hosts", "must be comma-separated host names or a list of them, e.g. 'x86,pi'",
                                 self.hosts)
        check_path("hosts_file", self.hosts_file)

    def names(self) -> str | None:
        """The hosts as the comma-separated text the host registry parses (a list given is joined).

        Returns
        -------
        str or None
            ``"pi,x86"``; None when no host was named (the command's default applies).
        """
        if self.hosts is None or isinstance(self.hosts, str):
            return self.hosts
        return ",".join(str(h) for h in self.hosts)


@dataclass(frozen=True)
class Fixtures:
    """The fixtures (labelled images) a command runs, shared by every command that runs a model.

    Parameters
    ----------
    labels : str, optional
        COCO JSON or CSV labels (None: the labels the variants were calibrated with, so eval stays disjoint).
    images : str, optional
        The labels' images folder (None: beside the labels).
    split : str
        ``train``, ``val``, ``eval`` or ``all``: eval by default, the images calibration never saw.
    limit : int, optional
        At most this many images of the split (None: all), for a quick look.
    sidecar : str, optional
        A sidecar JSON overriding the variants' own input recipe and decode block.
    """

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
    """onnxruntime session options for every host; unset ones leave each host its own deployed session.

    Parameters
    ----------
    config : dict
        Session config entries (KEY -> VALUE), e.g. ``{"session.x64quantprecision": "1"}``; checked against the keys
        onnxruntime knows.
    graph_opt : str, optional
        Graph optimisation level (``disabled``, ``basic``, ``extended``, ``all``; None: each host's own).
    threads : int, optional
        Intra-op threads (None: each host's own).
    providers : tuple of str, optional
        Execution providers in priority order (None: each host's own).
    require_providers : bool
        Refuse a requested provider that ran no node, instead of a silent fallback to the CPU.
    """

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
        """The session overrides these options give: only the ones set, each host's own session has the rest.

        Returns
        -------
        dict
            ``config_entries`` always, and ``graph_optimization_level``, ``intra_op_num_threads``, ``providers``
            where set; ParameterError for zero threads or an empty provider list.
        """
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
    """The results folder every command reads and writes: variants/, tables/, releases/, report.md.

    Parameters
    ----------
    root : str
        The results folder.
    tables_folder : str, optional
        The tables elsewhere (the command line's deprecated tables-folder option); its parent then holds what sits
        beside them.
    """

    root: str = RESULTS
    tables_folder: str | None = None

    def __post_init__(self):
        check_path("root", self.root, optional=False)
        check_path("tables_folder", self.tables_folder)

    @property
    def folder(self) -> Path:
        """The results folder itself (the tables folder's parent when `tables_folder` is given)."""
        return Path(self.tables_folder).parent if self.tables_folder else Path(self.root)

    @property
    def tables(self) -> Path:
        """The tables folder."""
        return Path(self.tables_folder) if self.tables_folder else Path(self.root) / TABLES


@dataclass(frozen=True)
class Output:
    """What a command prints besides its result.

    Parameters
    ----------
    progress : bool, optional
        Progress bars (None: only when stderr is a terminal, as on the command line).
    quiet : bool
        No summary, no bars.
    verbose : int
        Library warnings in full (onnxruntime's, quantization's) from 1 on.
    json : bool
        The summary as JSON on stdout (notes then go to stderr).
    """

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
        """Whether progress bars are drawn: as asked, else only on a terminal; never when quiet.

        Returns
        -------
        bool
        """
        if self.progress is not None:
            return bool(self.progress and not self.quiet)
        try:
            return sys.stderr.isatty() and not self.quiet
        except (AttributeError, ValueError):
            return False


_EXAMPLE = {"Fleet": "('x86,pi')", "Fixtures": "(labels='labels.json')", "Session": "(threads=1)",
            "Results": "('results')", "Output": "(quiet=True)", "Gates": "(gate='decision')"}
_GROUPS = {"fleet": Fleet, "fixtures": Fixtures, "session": Session, "results": Results, "output": Output}
