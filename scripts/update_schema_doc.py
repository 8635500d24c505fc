#!/usr/bin/env python3
"""Regenerate the schema section of docs/schema.md from quantbench/store/tableschema.py.

    python3 scripts/update_schema_doc.py          # rewrite the section in docs/schema.md
    python3 scripts/update_schema_doc.py --check  # exit 1 if docs/schema.md is out of date

The section between `<!-- section:schema -->` and `<!-- /section:schema -->` is
replaced by the output of `python -m quantbench.store.tableschema`; the rest of the page is
left byte for byte.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DOC = ROOT / "docs" / "schema.md"
START, END = "<!-- section:schema -->", "<!-- /section:schema -->"


def generated() -> str:
    out = subprocess.run([sys.executable, "-m", "quantbench.store.tableschema"], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out.stdout.strip("\n")


def replace_section(text: str, body: str) -> str:
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise SystemExit(f"{SCHEMA_DOC}: expected one {START} ... {END} section")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if the docs/schema.md section is out of date")
    args = ap.parse_args(argv)
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    new = replace_section(text, generated())
    if args.check:
        if new != text:
            print(f"{SCHEMA_DOC}: schema section out of date; run python3 scripts/update_schema_doc.py")
            return 1
        print(f"{SCHEMA_DOC}: schema section up to date")
        return 0
    if new != text:
        sys.path.insert(0, str(ROOT))
        from quantbench.fsutil import atomic_write_text

        atomic_write_text(SCHEMA_DOC, new)
        print(f"{SCHEMA_DOC}: schema section updated")
    else:
        print(f"{SCHEMA_DOC}: schema section already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
