"""`python -m quantbench` and the `quantbench` script: the command line, with Ctrl-C handled from the first line.

Importing the command line (numpy, onnx, pyarrow: about a second) and reading its defaults happen before
quantbench.cli.main runs a command; a Ctrl-C there has nothing to clean up (nothing is written before the command
runs), so it is one line and exit code 130, never a KeyboardInterrupt traceback. Once the command runs, cli.main
handles it (finished results are kept).

A reader that stops early (`quantbench hosts check x86 --json | head`) closes our stdout: like any Unix tool we stop
quietly with SIGPIPE's exit code, never a BrokenPipeError traceback."""

import os
import sys

INTERRUPTED = 130
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool its reader stopped


def entry() -> int:
    try:
        from quantbench.cli import main

        return main()
    except KeyboardInterrupt:
        sys.stderr.write("quantbench: interrupted before the command started; nothing was written\n")
        return INTERRUPTED
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        return BROKEN_PIPE


if __name__ == "__main__":
    raise SystemExit(entry())
