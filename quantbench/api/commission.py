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
        """How many fixtures the kit carries."""
        return len(self.expected["fixtures"])


def commission(variant: str, out, count: int = DEFAULT_COUNT, results: Results = Results(),
               force: bool = False) -> Kit:
    """Write the commissioning kit of `variant`, so a device checks itself against the classes an equiv measured:
    the model, fixtures, expected.json and check.py, from the equiv analysis in `results` that ran it.

    Parameters
    ----------
    variant : str
        The variant's name, or MODEL/NAME when several models have one of that name.
    out : str or path
        The kit's folder.
    count : int
        How many fixtures the kit carries: those that separated the classes and those nearest the decision
        threshold, alternately.
    results : Results
        The results folder holding that equiv analysis.
    force : bool
        Replace an earlier kit at `out` (never another folder).

    Returns
    -------
    Kit
        The kit's folder, expected.json's content and the notes worth printing.
    """
    res = write_commission(variant, out, count=count, results_dir=results.folder, force=force,
                           tables_root=results.tables)
    return Kit(res.folder, res.expected, res.notes)
