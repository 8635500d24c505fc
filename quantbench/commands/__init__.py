"""One module per subcommand.

Each module defines ``HELP`` (one sentence, also in COMMAND_HELP below),
``add_arguments(parser)`` and ``run(args) -> int``. ``quantbench --help`` imports
no command module and ``quantbench CMD`` only CMD's (cli.py), so a command module
imports its library at top; heavy third-party packages (onnxruntime, pyarrow,
matplotlib) still load only where they are used.
"""

from quantbench.errors import UserError
from quantbench.hosts.configkeys import check_config_keys

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
    "ci": ("Write a CI workflow (GitHub Actions and .gitlab-ci.yml): native ARM and x86 runners and emulated hosts in "
           "shards, one job merging them, equiv with your gate and the release archive."),
    "report": "Re-render results/report.md (and its plots) from the result tables of the last `quantbench equiv`.",
    "config": ("Show the option defaults in effect in this folder (hosts, fixtures, threshold, budget, ...) and where "
               "each comes from: a flag > quantbench.toml [defaults] > pyproject.toml [tool.quantbench] > built-in."),
    "tables": "Show the result tables' parts and rows, or compact small parts into sorted parts with statistics.",
}
COMMANDS = list(COMMAND_HELP)

# What a defaults table (config.py) may name, so it is checked without importing every command: each command's
# options (their dests) and the sub-actions a per-command table may name (a test checks both against the parser).
OPTION_KEYS = frozenset({
    "activation_type", "all", "allow_plugins", "allow_short", "archive", "as_host", "atol", "batch",
    "budget", "calibrate", "chunk_size", "cluster", "count_bins", "decode", "decode_only", "entropy_bins", "equiv_id", "error_images", "evidence", "evidence_fixtures",
    "exclude_nodes", "exclude_op_types", "export", "factors", "fixture", "fixtures", "force", "fp32", "gate",
    "graph_opt", "group", "host", "hosts", "hosts_file", "images", "install", "jobs", "json", "labels", "limit", "max_evaluations", "max_float_share", "max_memory", "max_seconds", "max_size",
    "methods", "model", "name", "native_runs", "native_shards", "no_plots", "no_progress", "no_registry", "no_run", "no_wait", "onnxruntime", "opt_level", "out",
    "per_cell", "per_channel", "percentile", "pre_process", "preprocess", "providers", "python", "quiet", "reduce_range",
    "reference", "remedies", "repeats", "require_providers", "results", "retain", "rtol", "runners", "runs", "sample", "screen_fixtures", "seed", "session_config",
    "shard", "shards", "sidecar", "skip_bad", "space", "split", "strata", "strip", "tables", "tag", "threads", "threshold", "types", "variant",
    "variants", "verbose", "warmup", "weight_type"
})
#: options whose commands take different kinds of value (equiv's --gate NAMES, diff's --gate switch): a shared
#: defaults key applies to the commands whose option takes its kind (quantbench.config)
MIXED_KIND_KEYS = frozenset({"gate"})
SUBCOMMANDS = ("hosts list", "hosts check", "hosts setup", "hosts exec", "tables compact", "tables info")


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


def add_plugin_arguments(p) -> None:
    """--allow-plugins: the one way to run the plug-ins a sidecar or received file names (quantbench.plugins)."""
    p.add_argument("--allow-plugins", action="store_true",
                   help="run the plug-ins (module:function) that sidecars and recipes name; without it only a "
                        "plug-in named on the command line (--decode, --preprocess) or recorded by calibrate runs")


def add_fixture_arguments(p, verb: str = "run", sidecar_and_limit: bool = True) -> None:
    """The evaluation-fixture argument group shared by run, equiv and the explain commands (one wording)."""
    g = p.add_argument_group("evaluation fixtures")
    g.add_argument("--fixtures", metavar="LABELS", help="COCO JSON or CSV labels of your evaluation images; default: "
                                                      "the labels the variants were calibrated with (the bundled "
                                                      "corpus for the demo models)")
    g.add_argument("--images", metavar="DIR", help="folder of the images named in the labels (default: the one "
                                                   "calibrated with; images/ beside a COCO file, a CSV's own folder)")
    g.add_argument("--split", default="eval", help=f"image split to {verb} (train, val, eval, or 'all')")
    if sidecar_and_limit:
        g.add_argument("--sidecar", metavar="FILE",
                       help="sidecar JSON (input, classes, decode) to use instead of the variants' own recipe; its "
                            "input block must match the calibration recipe")
        g.add_argument("--limit", type=int, help=f"{verb} only N images of the split, taken in turn from each "
                                                 "stratum (by file name within one): same N, same images")
    add_plugin_arguments(p)


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


def add_session_arguments(p, whose: str = "") -> None:
    """--session-config and --graph-opt: the onnxruntime session options every running command takes."""
    p.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                   help=f"onnxruntime session config entry{whose} (repeatable), e.g. session.x64quantprecision=1")
    p.add_argument("--graph-opt", default=None, choices=["disabled", "basic", "extended", "all"],
                   help=f"onnxruntime graph optimization level{whose} (default: each host's own, else all)")


def add_run_session_arguments(p) -> None:
    """The session flags of the commands that run every host under its own session (run, equiv): each given
    flag overrides that option for every host (quantbench.hosts.deploy)."""
    add_session_arguments(p, " for every host")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of every host's sessions (default: each host's deployed count: 4 on the "
                        "Pi and Graviton presets, 1 on x86)")
    p.add_argument("--providers", default=None,
                   help="comma-separated execution providers every host requests, in priority order (default: each "
                        "host's own, else CPUExecutionProvider)")
    p.add_argument("--require-providers", action="store_true",
                   help="refuse a run whose requested providers did not all run nodes (default: a flagged finding)")


def session_config(items) -> dict:
    """`--session-config KEY=VALUE ...` -> the session's config entries."""
    entries = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--session-config {item!r}: expected KEY=VALUE, e.g. session.x64quantprecision=1")
        entries[key.strip()] = value.strip()
    check_config_keys(entries, "--session-config")
    return entries


def session_from_args(args) -> dict:
    """The session overrides the session flags give (--session-config, --graph-opt, and --threads/--providers
    where the command has them): only the flags given, each host's own session supplies the rest."""
    out = base_session_from_args(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise UserError(f"--threads {threads}: must be at least 1")
        out["intra_op_num_threads"] = threads
    if getattr(args, "providers", None) is not None:
        providers = [p.strip() for p in args.providers.split(",") if p.strip()]
        if not providers:
            raise UserError("--providers: name at least one, e.g. CPUExecutionProvider")
        out["providers"] = providers
    return out


def base_session_from_args(args) -> dict:
    """The session options the explain commands vary from (graph optimisation if given, config entries)."""
    out = {"config_entries": session_config(args.session_config)}
    if args.graph_opt is not None:
        out["graph_optimization_level"] = args.graph_opt
    return out


def add_fleet_arguments(p) -> None:
    """--hosts (optional) and --hosts-file of a command that reads the hosts' fingerprints but runs no model (lint)."""
    p.add_argument("--hosts", metavar="HOSTS",
                   help="comma-separated hosts of your fleet (e.g. x86,x86-avx2,pi4): each one's int8 path is read "
                        "from its fingerprint and every layer names the hosts it affects")
    p.add_argument("--hosts-file", metavar="FILE", help="TOML hosts file (default: quantbench.toml if present)")


def add_explain_arguments(p, hosts_default: str | None = None, variant_required: bool = True) -> None:
    """Options shared by the explain commands (variant, hosts, fixtures, session, tables)."""
    p.add_argument("--variant", required=variant_required,
                   help="variant name from the last `quantbench calibrate` (fp32, dynamic, static-minmax, ...) or an .onnx file")
    p.add_argument("--hosts", required=hosts_default is None, default=hosts_default,
                   help="comma-separated hosts; NAME+KEY=VALUE sets a session option or config entry for that host, "
                        "e.g. x86,x86+session.x64quantprecision=1")
    add_fixture_arguments(p, "use", sidecar_and_limit=False)
    add_session_arguments(p, " of the run being explained (every host)")
    p.add_argument("--hosts-file", metavar="FILE", help="TOML hosts file (default: quantbench.toml if present)")
    p.add_argument("--tables", metavar="DIR", help="result tables folder (default: results/tables)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
