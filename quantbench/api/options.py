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

import sys
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import ParameterError

RESULTS = "results"
TABLES = "tables"


@dataclass(frozen=True)
class Fleet:
    """hosts: comma-separated host names (or a list); hosts_file: the TOML hosts file (None: ./quantbench.toml)."""

    hosts: str | None = None
    hosts_file: str | None = None

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


@dataclass(frozen=True)
class Session:
    """Session options for every host: config entries (KEY -> VALUE), graph optimisation level, intra-op threads,
    execution providers in priority order, and whether a requested provider that ran no node is refused."""

    config: dict = field(default_factory=dict)
    graph_opt: str | None = None
    threads: int | None = None
    providers: tuple | None = None
    require_providers: bool = False

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

    def bars(self) -> bool:
        """Whether progress bars are drawn."""
        if self.progress is not None:
            return bool(self.progress and not self.quiet)
        try:
            return sys.stderr.isatty() and not self.quiet
        except (AttributeError, ValueError):
            return False
