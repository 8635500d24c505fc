"""User-facing errors: one line, exit code 2, never a traceback."""


_MARK = "\x1e"


def flag_mark(param: str) -> str:
    """Where a message must point at a parameter's flag ("pass <images> DIR"): a mark the CLI renders as the
    flag (--images) and ``str(exc)`` as the parameter's name, so the library never names a flag."""
    return f"{_MARK}{param}{_MARK}"


def render_params(text: str, name_of=lambda param: param) -> str:
    """`text` with each flag_mark(param) mark replaced by name_of(param) (default: the parameter's name)."""
    parts = text.split(_MARK)
    return "".join(name_of(p) if i % 2 else p for i, p in enumerate(parts))


def marked(exc: Exception) -> str:
    """`exc`'s message with its parameters still marked (flag_mark(param)), for a message that wraps it: the CLI then
    names their flags in the wrapping message too."""
    if isinstance(exc, ParameterError):
        head = f"{flag_mark(exc.param)} {exc.value}" if exc.show_value else flag_mark(exc.param)
        return f"{head}: {exc.problem}"
    return Exception.__str__(exc)


class UserError(Exception):
    """A mistake the user can fix (bad file, bad option, missing setup).

    The CLI prints ``quantbench: error: <message>`` on one line and exits 2.
    Messages should name the file or parameter and say what to do (a parameter's flag as flag_mark(param)).
    """

    exit_code = 2

    def __str__(self) -> str:
        return render_params(super().__str__())


class DiskFull(UserError):
    """A file could not be written: no space left on the device (or the quota is used up). `path` names it."""

    def __init__(self, message: str, path):
        super().__init__(message)
        self.path = path


class NotWritable(UserError, OSError):
    """A folder takes no new file (a read-only file system, no permission): one line naming it. Also an OSError
    (its errno kept), so a writer for whom a file not written is no error (a cache) goes on as before."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_


class GateFailed(Exception):
    """A --gate condition failed; the CLI exits 1 after printing the summary."""

    exit_code = 1


class ParameterError(UserError):
    """A bad library parameter: the library names the parameter, the CLI names the flag.

    ``str(exc)`` is ``per_cell=0: must be at least 1``; the command line shows
    ``--per-cell 0: must be at least 1`` (cli.py maps the parameter to the option
    whose dest it is), so each value is validated once, in the library.
    """

    def __init__(self, param: str, problem: str, value=None, show_value: bool = True):
        self.param, self.problem, self.value, self.show_value = param, problem, value, show_value and value is not None
        super().__init__(f"{param}={value!r}: {problem}" if self.show_value else f"{param}: {problem}")

    def for_flag(self, flag: str) -> str:
        return f"{flag} {self.value}: {self.problem}" if self.show_value else f"{flag}: {self.problem}"


class PluginNotAllowed(UserError):
    """A file (a sidecar, a recipe, a received archive) names code the user did not ask to run.

    The library says which file asked for which code; the CLI adds how to allow it
    (cli.py), since the library never names a flag.
    """

    def __init__(self, message: str, ref: str):
        self.ref = ref
        super().__init__(message)
