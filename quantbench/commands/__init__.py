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
    "tables",
]
