"""One module per subcommand.

Each module defines ``HELP`` (one sentence), ``add_arguments(parser)`` and
``run(args) -> int``. Keep module-level imports light: ``quantbench --help``
imports every command module, so heavy imports (onnxruntime, torch) belong
inside ``run``.
"""

# Order in which `quantbench --help` lists the commands (pipeline order).
COMMANDS = [
    "calibrate",
    "run",
    "hosts",
    "equiv",
    "localize",
    "lint",
    "remedy",
    "noise",
    "latency",
    "diff",
    "release",
    "verify",
    "report",
    "config",
]


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


def add_fixture_arguments(p, verb: str = "run") -> None:
    """The evaluation-fixture argument group shared by run and equiv (one wording, one set of defaults)."""
    g = p.add_argument_group("evaluation fixtures")
    g.add_argument("--fixtures", metavar="LABELS.json", help="COCO labels of your evaluation images; default: the bundled corpus")
    g.add_argument("--images", metavar="DIR", help="folder of the images named in --fixtures (default: images/ beside it)")
    g.add_argument("--split", default="eval", help=f"image split to {verb} (train, val, eval, or 'all')")
    g.add_argument("--sidecar", metavar="FILE",
                   help="sidecar JSON (input, classes, decode) to use instead of the variants' own recipe; its input "
                        "block must match the calibration recipe")
    g.add_argument("--limit", type=int, help=f"{verb} only the first N images of the split (by file name)")
