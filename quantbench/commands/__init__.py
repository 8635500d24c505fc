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
