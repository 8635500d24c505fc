"""`quantbench.commission(...)`: a commissioning kit of one variant (the `commission` command), so a device checks
itself against the classes an equiv measured (quantbench.release.commission)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantbench.api.options import Results
from quantbench.release.commission import DEFAULT_COUNT, commission as write_commission


@dataclass
class Kit:
    """A written kit: its folder, expected.json's content, the notes worth printing."""

    folder: Path
    expected: dict
    notes: list[str]

    @property
    def classes(self) -> list:
        """[(label, [hosts])] of the measured classes the kit holds, in label order."""
        return [(c["label"], [h["host"] for h in c["hosts"]]) for c in self.expected["classes"]]

    @property
    def fixtures(self) -> int:
        return len(self.expected["fixtures"])


def commission(variant: str, out, count: int = DEFAULT_COUNT, results: Results = Results(),
               force: bool = False) -> Kit:
    """Write the commissioning kit of `variant` (its name, or MODEL/NAME) to the folder `out` from the equiv
    analysis in `results` that ran it: the model, `count` fixtures, expected.json and check.py. `force` replaces an
    earlier kit at `out` (never another folder)."""
    res = write_commission(variant, out, count=count, results_dir=results.folder, force=force,
                           tables_root=results.tables)
    return Kit(res.folder, res.expected, res.notes)
