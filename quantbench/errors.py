"""User-facing errors: one line, exit code 2, never a traceback."""


class UserError(Exception):
    """A mistake the user can fix (bad file, bad option, missing setup).

    The CLI prints ``quantbench: error: <message>`` on one line and exits 2.
    Messages should name the file or option and say what to do.
    """

    exit_code = 2


class GateFailed(Exception):
    """A --gate condition failed; the CLI exits 1 after printing the summary."""

    exit_code = 1
