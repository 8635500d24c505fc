"""`python -m quantbench` and the `quantbench` script: the command line, with Ctrl-C handled from the first line.

Importing the command line (numpy, onnx, pyarrow: about a second) and reading its defaults happen before
quantbench.cli.main runs a command; a Ctrl-C there has nothing to clean up (nothing is written before the command
runs), so it is one line and exit code 130, never a KeyboardInterrupt traceback. Once the command runs, cli.main
handles it (finished results are kept)."""

import sys

INTERRUPTED = 130


def entry() -> int:
    try:
        from quantbench.cli import main

        return main()
    except KeyboardInterrupt:
        sys.stderr.write("quantbench: interrupted before the command started; nothing was written\n")
        return INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(entry())
