"""An equiv result on the command line: `quantbench equiv` and `quantbench report` print it one way.

A CLI-layer module of its own, not commands/__init__.py, which every invocation (and `quantbench --help`)
imports: only these two commands load the analysis and report modules it needs.
"""

from pathlib import Path

from quantbench.analysis.equiv import as_json
from quantbench.errors import GateFailed, render_params
from quantbench.report.termsummary import equiv_summary_text


def print_equiv(result, files, gates, failures, as_json_text: bool, run_line: str | None = None,
                render=render_params) -> int:
    """Print an equiv result (text, or JSON) and the files written; a failed gate raises GateFailed. `render` shows
    the parameters the text points at (errors.flag_mark) as this command line's flags."""
    if as_json_text:
        summary = result.summary()
        summary["files"] = [str(f) for f in files]
        summary["gates"] = {"checked": gates, "failures": failures}
        summary["run_line"] = run_line or ""
        print(as_json(summary))
    else:
        if run_line:
            print(render(run_line))
        print(render(equiv_summary_text(result)))
        print("")
        thumbs = [f for f in files if Path(f).parent.name == "gallery"]
        for f in files:
            if f not in thumbs:
                print(f"wrote {f}")
        if thumbs:
            print(f"wrote {len(thumbs)} flip gallery thumbnails under {Path(thumbs[0]).parent}/")
        if not result.flip_rows and any(c.get("decisions_compared", True) for c in result.comparisons):
            print("flips table: no rows to add (no flips)")
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise GateFailed(f"{failures[0]}{more}")
    return 0
