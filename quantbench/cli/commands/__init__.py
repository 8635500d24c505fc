"""One module per subcommand.

Each module defines ``HELP`` (one sentence, also in COMMAND_HELP below),
``add_arguments(parser)`` and ``run(args) -> int``. ``quantbench --help`` imports
no command module and ``quantbench CMD`` only CMD's (cli.py), so a command module
imports its library at top; heavy third-party packages (onnxruntime, pyarrow,
matplotlib) still load only where they are used.
"""

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from quantbench.cli.groups import GROUPS, OUTPUT

# `quantbench --help` lists the commands from this table, in this (pipeline) order, without importing their
# modules; each entry is its module's HELP (a test checks they agree).
COMMAND_HELP = {
    "calibrate": ("Build a calibration set balanced by your data's strata x lighting and make fp32, dynamic and "
                  "static QDQ int8 variants (MinMax, Percentile, Entropy) with memory-bounded, order-independent "
                  "calibration."),
    "run": ("Run every model variant on every eval fixture on each host (local, emulated, ssh, imported) and hash "
            "every output."),
    "hosts": "List hosts and whether each is ready, check one with a smoke job, or set up emulated hosts.",
    "equiv": ("Run (or reuse) every variant on every host, then report equivalence classes of byte-identical hosts, "
              "decision flips against fp32, count concealment, margins and the tensor vs decision gates."),
    "localize": ("Find the first node whose output differs between two hosts, hashing every intermediate tensor in "
                 "bounded memory."),
    "lint": ("Lint an int8 model's weights for x86 vpmaddubsw saturation, NEON int16 wrap and int32 overflow, per "
             "layer."),
    "remedy": ("Try reduce_range, session.x64quantprecision=1, S8S8 and U8U8 on a split variant: which bring all "
               "hosts into one class, at what decision cost."),
    "search": ("Search recipes (global remedies, calibration, nodes kept in float) for the one that meets a decision "
               "budget on every host, and write it as a variant."),
    "noise": ("Measure each host's noise floor: repeated runs, threads 1 vs N, batch 1 vs 8, graph optimisation basic "
              "vs all, 1 thread vs the host's deployed count, its providers vs the CPU provider."),
    "latency": ("Measure latency (median of timed runs, spread over repeats) and peak RSS on local/ssh hosts; never "
                "under emulation."),
    "diff": ("Compare two ONNX files: op types, initializers, interface, opset, producer, value_info and doc_strings, "
             "ranked by semantic risk (not by bytes), with raw and semantic hashes of both."),
    "release": ("Write results/releases/NAME/ (Parquet tables, report.md, release.json with recipe, environment, raw "
                "and semantic hashes and per-host behaviour) and register its release keys."),
    "verify": ("Check a release folder or archive (.tar.gz from `release --archive`): re-hash retained artifacts, "
               "re-read every Parquet table against its recorded hash, and with --host re-run a sample of fixtures "
               "there and compare output hashes (exit 0 pass, 1 fail)."),
    "commission": ("Write a commissioning kit of one variant after equiv ran it (model, fixtures, expected.json, "
                   "check.py): a device with Python, numpy and onnxruntime runs check.py to learn which measured class "
                   "it is in."),
    "ci": ("Write a CI workflow (GitHub Actions and .gitlab-ci.yml): native ARM and x86 runners (and the masked x86 "
           "tiers each runner's CPU shows) and emulated hosts in shards, one job merging them, equiv with your gate "
           "and the release archive."),
    "report": "Re-render results/report.md (and its plots) from the result tables of the last `quantbench equiv`.",
    "config": ("Show the option defaults in effect in this folder (hosts, fixtures, threshold, budget, ...) and where "
               "each comes from: a flag > quantbench.toml [defaults] > pyproject.toml [tool.quantbench] > built-in."),
    "tables": "Show the result tables' parts and rows, or compact small parts into sorted parts with statistics.",
}
COMMANDS = list(COMMAND_HELP)

@dataclass(frozen=True)
class Declared:
    """What the command modules declare, read from their source: every option's dest (-> the kinds of value its
    options take: switch, value), and the sub-actions a per-command defaults table may name ("hosts list")."""

    options: dict
    subcommands: tuple

    @property
    def mixed(self) -> frozenset:
        """Options whose commands take different kinds of value (equiv's --gate NAMES, diff's --gate switch): a
        shared defaults key applies to the commands whose option takes its kind (quantbench.cli.config)."""
        return frozenset(d for d, kinds in self.options.items() if len(kinds) > 1)


_SWITCH_ACTIONS = ("store_true", "store_false")


def _option_dest(call: ast.Call) -> tuple[str, bool] | None:
    """(dest, is a switch) of an `add_argument(...)` call with literal option strings; None for a positional."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [n for n in names if n.startswith("--")] or [n for n in names if n.startswith("-")]
    if not longs:
        return None
    kw = {k.arg: k.value for k in call.keywords}
    dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else longs[0].lstrip("-").replace("-", "_")
    action = kw.get("action")
    switch = (isinstance(action, ast.Constant) and action.value in _SWITCH_ACTIONS) or \
        (isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction")
    return dest, switch


def _group_dests(call: ast.Call) -> dict:
    """The dests of a group constructed in a command module (`FleetArgs(default="x86")`, literal arguments)."""
    cls = GROUPS[call.func.id]
    args = [ast.literal_eval(a) for a in call.args]
    return cls(*args, **{k.arg: ast.literal_eval(k.value) for k in call.keywords}).dests()


def _module_declares(path: Path) -> tuple[dict, list]:
    """({dest: {switch?}}, [sub-action names]) of one command module's source."""
    options: dict = {}
    subs = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        found = {}
        if isinstance(node.func, ast.Name) and node.func.id in GROUPS:
            found = _group_dests(node)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found = dict([d]) if (d := _option_dest(node)) else {}
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser" and node.args:
            subs.append(ast.literal_eval(node.args[0]))
        for dest, switch in found.items():
            options.setdefault(dest, set()).add(switch)
    return options, subs


@functools.lru_cache(maxsize=1)
def declared() -> Declared:
    """Every command's options and sub-actions, from the command modules' source (no command is imported: a
    defaults table is checked whichever command runs, `quantbench --help` included); the output group every
    command gets (cli.py) counts for each. A test checks it against the whole parser."""
    options = {d: {s} for d, s in OUTPUT.dests().items()}
    subs = []
    for name in ["__init__", *COMMANDS]:   # __init__: the --jobs and --shard helpers below
        mod_options, mod_subs = _module_declares(Path(__file__).parent / f"{name}.py")
        for dest, kinds in mod_options.items():
            options.setdefault(dest, set()).update(kinds)
        subs += [f"{name} {s}" for s in mod_subs]
    return Declared({d: frozenset(k) for d, k in options.items()}, tuple(subs))


def finite_float(text: str) -> float:
    """argparse type: a finite float (nan and inf are refused: `--threshold nan` made every comparison false)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number (got {text!r})")
    return value


def address(text: str) -> str:
    """argparse type: a non-empty address (`--cluster ''` ran everything here without a word)."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give the scheduler's address, e.g. tcp://HOST:8786")
    return text.strip()


def add_jobs_argument(p) -> None:
    """--jobs of the commands that run hosts (run, equiv)."""
    p.add_argument("--jobs", type=int, help="worker processes in total (default: the core count; at most that)")
    p.add_argument("--cluster", metavar="ADDRESS", type=address,
                   help="run the emulated hosts on the Dask cluster whose scheduler is at ADDRESS (tcp://HOST:8786; "
                        "quantbench[cluster] and `hosts setup` on every worker); other hosts run here")


def add_shard_argument(p) -> None:
    """--shard K/N of the commands that run hosts (run, equiv): one deterministic part of the fixtures."""
    p.add_argument("--shard", metavar="K/N",
                   help="run only shard K of N of the fixtures (balanced over strata, by content id); export each "
                        "shard and give the files to one imported host to merge them")
