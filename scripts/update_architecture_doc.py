#!/usr/bin/env python3
"""Regenerate the layer table of docs/architecture.md from the folder map (tests/test_architecture.py: LAYERS).

    python3 scripts/update_architecture_doc.py          # rewrite the table in docs/architecture.md
    python3 scripts/update_architecture_doc.py --check  # exit 1 if docs/architecture.md is out of date

The section between `<!-- section:layers -->` and `<!-- /section:layers -->` is replaced by
test_architecture.layers_markdown(); the rest of the page is left byte for byte.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- section:layers -->", "<!-- /section:layers -->"


def generated() -> str:
    spec = importlib.util.spec_from_file_location("test_architecture", ROOT / "tests" / "test_architecture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.layers_markdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if the table is out of date")
    args = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise SystemExit(f"{DOC}: expected one {START} ... {END} section")
    head, rest = text.split(START, 1)
    new = f"{head}{START}\n{generated()}\n{END}{rest.split(END, 1)[1]}"
    if args.check:
        print(f"{DOC}: layer table {'up to date' if new == text else 'out of date; run ' + sys.argv[0]}")
        return 0 if new == text else 1
    if new != text:
        sys.path.insert(0, str(ROOT))
        from quantbench.fsutil import atomic_write_text

        atomic_write_text(DOC, new)
    print(f"{DOC}: layer table {'updated' if new != text else 'already up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
