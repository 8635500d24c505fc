"""The shared option groups of the command line, each declared once with its help (Polygraphy's tools/args pattern).

A group adds its arguments to a command's parser (`add`) and turns the parsed flags into its typed value
(`parse`: quantbench.api.options), which the command passes down; no library module sees the argparse namespace.
A command holds its groups as module-level instances (`FLEET = FleetArgs(default="x86")`), the constructor's
literal arguments saying how it takes them: quantbench.cli.commands.declared reads those declarations from the
command modules' source to check a defaults table's keys without importing every command.
"""

from __future__ import annotations

import abc
import argparse
import sys
from dataclasses import dataclass

from quantbench.api.options import RESULTS, Fixtures, Fleet, Output, Results, Session
from quantbench.errors import UserError
from quantbench.inputs.configkeys import check_entries

#: the release that removes the deprecated --tables alias of --results (docs/api.md)
TABLES_ALIAS_REMOVED_IN = "0.3.0"
GRAPH_OPT = ["disabled", "basic", "extended", "all"]


class ArgGroup(abc.ABC):
    """One concept's options: `add(parser)` declares them, `parse(args)` returns the concept's value."""

    @abc.abstractmethod
    def add(self, parser) -> None:
        """Declare the group's options on `parser`."""

    @abc.abstractmethod
    def parse(self, args):
        """The group's value from the parsed flags."""

    def dests(self) -> dict:
        """dest -> whether it is a switch (true/false), of the options this group adds."""
        p = argparse.ArgumentParser(add_help=False)
        self.add(p)
        return {a.dest: isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                       argparse.BooleanOptionalAction)) for a in p._actions if a.option_strings}


class FleetArgs(ArgGroup):
    """--hosts and --hosts-file. `default`/`required`: --hosts' default; `per_host`: NAME+KEY=VALUE is allowed;
    `hosts`: False for a command that only reads the hosts file (`hosts`, `verify`)."""

    def __init__(self, default: str | None = None, required: bool = False, per_host: bool = False,
                 hosts: bool = True, fingerprints: bool = False):
        self.default, self.required, self.per_host, self.hosts = default, required, per_host, hosts
        self.fingerprints = fingerprints

    def add(self, parser) -> None:
        g = parser.add_argument_group("fleet")
        if self.hosts:
            text = ("comma-separated hosts: built-ins (x86, local, x86 tiers), emulated presets (pi, pi4, ...) or "
                    "names from the hosts file; `quantbench hosts list` shows them")
            if self.per_host:
                text += "; NAME+KEY=VALUE sets a session option or config entry for that host, e.g. " \
                        "x86,x86+session.x64quantprecision=1"
            if self.fingerprints:
                text += "; each one's int8 path is read from its fingerprint"
            g.add_argument("--hosts", metavar="HOSTS", default=self.default, required=self.required, help=text)
        g.add_argument("--hosts-file", metavar="FILE",
                       help="TOML hosts file naming ssh, emulated and imported hosts (default: quantbench.toml if "
                            "present)")

    def parse(self, args) -> Fleet:
        return Fleet(hosts=getattr(args, "hosts", None) if self.hosts else None, hosts_file=args.hosts_file)


class PluginArgs(ArgGroup):
    """--allow-plugins: the one way to run the plug-ins a sidecar or received file names (quantbench.inputs.plugins)."""

    def add(self, parser) -> None:
        parser.add_argument("--allow-plugins", action="store_true",
                            help="run the plug-ins (module:function) that sidecars and recipes name; without it only "
                                 "a plug-in named on the command line (--decode, --preprocess) or recorded by "
                                 "calibrate runs")

    def parse(self, args) -> bool:
        return bool(args.allow_plugins)


class FixtureArgs(ArgGroup):
    """The evaluation fixtures: --fixtures, --images, --split (and --sidecar, --limit where `sidecar_and_limit`);
    `verb` says what the command does with the split."""

    def __init__(self, verb: str = "run", sidecar_and_limit: bool = True):
        self.verb, self.sidecar_and_limit = verb, sidecar_and_limit

    def add(self, parser) -> None:
        g = parser.add_argument_group("evaluation fixtures")
        g.add_argument("--fixtures", metavar="LABELS", help="COCO JSON or CSV labels of your evaluation images; "
                                                          "default: the labels the variants were calibrated with "
                                                          "(the bundled corpus for the demo models)")
        g.add_argument("--images", metavar="DIR", help="folder of the images named in the labels (default: the one "
                                                       "calibrated with; images/ beside a COCO file, a CSV's own "
                                                       "folder)")
        g.add_argument("--split", default="eval", help=f"image split to {self.verb} (train, val, eval, or 'all')")
        if self.sidecar_and_limit:
            g.add_argument("--sidecar", metavar="FILE",
                           help="sidecar JSON (input, classes, decode) to use instead of the variants' own recipe; "
                                "its input block must match the calibration recipe")
            g.add_argument("--limit", type=int, help=f"{self.verb} only N images of the split, taken in turn from "
                                                     "each stratum (by file name within one): same N, same images")
        PluginArgs().add(parser)

    def parse(self, args) -> Fixtures:
        return Fixtures(labels=args.fixtures, images=args.images, split=args.split,
                        limit=getattr(args, "limit", None) if self.sidecar_and_limit else None,
                        sidecar=getattr(args, "sidecar", None) if self.sidecar_and_limit else None)


def session_config(items, option: str = "--session-config") -> dict:
    """`--session-config KEY=VALUE ...` (or `option`'s) -> the session's config entries."""
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{option} {item!r}: expected KEY=VALUE, e.g. session.x64quantprecision=1")
        pairs.append((key.strip(), value.strip(" \t")))
    return check_entries(pairs, option)


class SessionArgs(ArgGroup):
    """The onnxruntime session options: --session-config and --graph-opt; with `every_host` (the commands that run
    every host under its own session: run, equiv, hosts check) also --threads, --providers, --require-providers,
    each given one overriding that option for every host (quantbench.hosts.deploy). `whose`: whose session."""

    def __init__(self, whose: str = " for every host", every_host: bool = True):
        self.whose, self.every_host = whose, every_host

    def add(self, parser) -> None:
        g = parser.add_argument_group("session")
        g.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                       help=f"onnxruntime session config entry{self.whose} (repeatable), e.g. "
                            "session.x64quantprecision=1")
        g.add_argument("--graph-opt", default=None, choices=GRAPH_OPT,
                       help=f"onnxruntime graph optimization level{self.whose} (default: each host's own, else all)")
        if self.every_host:
            g.add_argument("--threads", type=int, default=None,
                           help=f"intra-op threads{self.whose} (default: each host's deployed count: 4 on the Pi "
                                "and Graviton presets, 1 on x86)")
            g.add_argument("--providers", default=None,
                           help=f"comma-separated execution providers{self.whose}, in priority order (default: "
                                "each host's own, else CPUExecutionProvider)")
            g.add_argument("--require-providers", action="store_true",
                           help="refuse a run whose requested providers did not all run nodes (default: a flagged "
                                "finding)")

    def parse(self, args) -> Session:
        threads = providers = None
        if self.every_host:
            threads = args.threads
            if threads is not None and threads < 1:
                raise UserError(f"--threads {threads}: must be at least 1")
            if args.providers is not None:
                providers = tuple(p.strip() for p in args.providers.split(",") if p.strip())
                if not providers:
                    raise UserError("--providers: name at least one, e.g. CPUExecutionProvider")
        return Session(config=session_config(args.session_config), graph_opt=args.graph_opt, threads=threads,
                       providers=providers, require_providers=bool(getattr(args, "require_providers", False)))


class _DeprecatedTables(argparse.Action):
    """--tables DIR: the old name of the results folder option (the tables folder itself); still works, says so."""

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stderr.write(f"note: --tables is deprecated and goes in {TABLES_ALIAS_REMOVED_IN}: use "
                         f"--results DIR (tables under DIR/tables)\n")
        setattr(namespace, self.dest, values)


class ResultsArgs(ArgGroup):
    """--results DIR, the results folder (tables under DIR/tables), one name on every command. `tables_alias`: the
    command once took --tables DIR (the tables folder), kept as a deprecated alias until TABLES_ALIAS_REMOVED_IN.
    `what`: what this command keeps there."""

    def __init__(self, tables_alias: bool = False, what: str = "tables under DIR/tables"):
        self.tables_alias, self.what = tables_alias, what

    def add(self, parser) -> None:
        g = parser.add_argument_group("results")
        g.add_argument("--results", default=RESULTS, metavar="DIR", help=f"results folder ({self.what})")
        if self.tables_alias:
            g.add_argument("--tables", metavar="DIR", action=_DeprecatedTables,
                           help=f"deprecated (removed in {TABLES_ALIAS_REMOVED_IN}): the result tables folder "
                                "itself; use --results")

    def parse(self, args) -> Results:
        return Results(root=args.results, tables_folder=getattr(args, "tables", None) if self.tables_alias else None)


class OutputArgs(ArgGroup):
    """-q/--quiet, -v/--verbose, --json, --no-progress: every command's output (cli.py adds it to each); an
    option the command already defines is left to it."""

    def add(self, parser) -> None:
        have = {o for a in parser._actions for o in a.option_strings}
        g = parser.add_argument_group("output (every command)")
        if "--quiet" not in have:
            g.add_argument("-q", "--quiet", action="store_true", help="print no summary (errors only; see the exit code)")
        if "--verbose" not in have:
            g.add_argument("-v", "--verbose", action="count", default=0,
                           help="show onnxruntime's and the quantizer's warnings in full (summarised otherwise)")
        if "--json" not in have:
            g.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
        if "--no-progress" not in have:
            g.add_argument("--no-progress", action="store_true",
                           help="no progress bars (they are drawn only when stderr is a terminal anyway)")

    def parse(self, args) -> Output:
        return Output(progress=not getattr(args, "no_progress", False), quiet=bool(getattr(args, "quiet", False)),
                      verbose=int(getattr(args, "verbose", 0) or 0), json=bool(getattr(args, "json", False)))


OUTPUT = OutputArgs()
#: the group classes a command module may declare (quantbench.cli.commands.declared reads them from source)
GROUPS = {c.__name__: c for c in (FleetArgs, PluginArgs, FixtureArgs, SessionArgs, ResultsArgs, OutputArgs)}


@dataclass(frozen=True)
class Explained:
    """What an explain command explains: the variant, on which fleet, fixtures, session and results folder."""

    variant: str
    fleet: Fleet
    fixtures: Fixtures
    session: Session
    results: Results


class ExplainArgs(ArgGroup):
    """The options the explain commands share (localize, noise, remedy): --variant, the fleet (--hosts required,
    NAME+KEY=VALUE per host), the fixtures they use, the session of the run being explained, the results folder."""

    def __init__(self, variant_required: bool = True):
        self.variant_required = variant_required
        self.fleet = FleetArgs(required=True, per_host=True)
        self.fixtures = FixtureArgs("use", sidecar_and_limit=False)
        self.session = SessionArgs(" of the run being explained (every host)", every_host=False)
        self.results = ResultsArgs(tables_alias=True)

    def add(self, parser) -> None:
        parser.add_argument("--variant", required=self.variant_required,
                            help="variant name from the last `quantbench calibrate` (fp32, dynamic, static-minmax, "
                                 "...) or an .onnx file")
        for group in (self.fleet, self.fixtures, self.session, self.results):
            group.add(parser)

    def parse(self, args) -> Explained:
        return Explained(args.variant, self.fleet.parse(args), self.fixtures.parse(args), self.session.parse(args),
                         self.results.parse(args))


GROUPS["ExplainArgs"] = ExplainArgs
