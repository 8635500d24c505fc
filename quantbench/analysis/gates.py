"""Two gates side by side: a tensor tolerance gate and a decision gate.

The tensor gate uses Polygraphy's element-wise rule: an element fails when
``|delta| > atol`` AND ``|delta| > rtol * |reference|`` (NaN on one side only
fails; an output whose shape or dtype differs fails whole). The decision gate
passes when the flips are at most a budget. They answer different questions,
and they disagree: a tensor gate can block an artifact whose served decisions
barely move, and pass one whose decisions moved. Both verdicts are reported,
and the disagreements are listed. ``ship_verdict`` turns a variant's gates, flips
and host agreement into the answer its verdict line opens with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from quantbench.errors import ParameterError, UserError, flag_mark

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5
DEFAULT_BUDGET = 0
GATES = ("tensor", "decision", "classes")


def failures_and_max(ref, cand, atol: float, rtol: float) -> tuple[int, float | None]:
    """(failing elements, max |delta| over the elements finite on both sides, None if there is none),
    from one float64 conversion of each side; shapes that differ: (every element, None)."""
    ref = np.asarray(ref)
    cand = np.asarray(cand)
    if ref.shape != cand.shape:
        return max(ref.size, cand.size, 1), None
    r = ref.astype(np.float64)
    c = cand.astype(np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(c - r)
        fail = (d > atol) & (d > rtol * np.abs(r))
    nan_r, nan_c = np.isnan(r), np.isnan(c)
    inf_diff = (np.isinf(r) | np.isinf(c)) & (r != c) & ~nan_r & ~nan_c
    fail = fail | inf_diff | (nan_r ^ nan_c)
    ok = np.isfinite(r) & np.isfinite(c)
    return int(np.count_nonzero(fail)), (float(d[ok].max()) if ok.any() else None)


@dataclass
class TensorGate:
    elements: int = 0
    failing: int = 0
    fixtures_failing: int = 0
    max_abs: float = 0.0

    @property
    def passed(self) -> bool:
        return self.failing == 0

    def add_fixture(self, ref_outputs: dict, cand_outputs: dict, atol: float, rtol: float) -> None:
        bad = 0
        for name, r in ref_outputs.items():
            c = cand_outputs.get(name)
            if c is None:
                bad += max(np.size(r), 1)
                continue
            n_bad, biggest = failures_and_max(r, c, atol, rtol)
            bad += n_bad
            self.elements += int(np.size(r))
            if biggest is not None:
                self.max_abs = max(self.max_abs, biggest)
        self.failing += bad
        self.fixtures_failing += int(bad > 0)

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


@dataclass(frozen=True)
class Budget:
    """A decision budget per host: a count of flips, or a share of the decisions fp32 serves on that host over the
    fixtures counted (``1%``: users think in shares; the count it allows is printed beside it)."""

    flips: int = DEFAULT_BUDGET
    share: float | None = None     # 0..1; None: `flips` is the budget

    def allowed(self, served: int) -> int:
        """The flips allowed on a host where fp32 serves `served` decisions."""
        return self.flips if self.share is None else math.floor(self.share * served + 1e-9)

    def value(self):
        """As the user gave it: the count (int), or the share as text ("1%")."""
        return self.flips if self.share is None else f"{self.share * 100:g}%"

    def describe(self, served: dict | None = None) -> str:
        """"0 flips per host", or "1% of the served decisions per host (x86 3 of 312, ...)"."""
        if self.share is None:
            return f"{self.flips} flips per host"
        counts = ", ".join(f"{h} {self.allowed(n)} of {n}" for h, n in (served or {}).items())
        return f"{self.value()} of the served decisions per host" + (f" ({counts})" if counts else "")


def check_tolerance(name: str, value) -> None:
    """A tolerance (`name`: atol or rtol) is a finite number at least 0: nan passed every tensor gate."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParameterError(name, "must be a finite number", value)
    if value < 0:
        raise ParameterError(name, "must be at least 0", value)


def parse_budget(value, param: str = "budget") -> Budget:
    """A Budget from a count (3, "3") or a share of the served decisions ("1%", "0.5%"); ParameterError(`param`)
    otherwise."""
    if isinstance(value, Budget):
        return value
    text = str(value).strip()
    if isinstance(value, bool) or isinstance(value, float):
        raise ParameterError(param, "give a number of flips (3) or a share of the served decisions (1%)", value)
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = float("nan")
        if not math.isfinite(pct) or not 0 <= pct <= 100:
            raise ParameterError(param, "a share of the served decisions is between 0% and 100%", value)
        return Budget(0, pct / 100)
    try:
        flips = int(text)
    except ValueError:
        raise ParameterError(param, "give a number of flips (3) or a share of the served decisions (1%)",
                             value) from None
    if flips < 0:
        raise ParameterError(param, f"must be 0 or more flips (got {flips})")
    return Budget(flips)


def decision_passed(flips: int, budget=DEFAULT_BUDGET, served: int = 0) -> bool:
    """Whether `flips` are within `budget` (a count, or a share of the `served` decisions fp32 serves)."""
    return flips <= parse_budget(budget).allowed(served)



def budget_words(budget) -> str:
    """"3 flips", or "1% of the served decisions"."""
    b = parse_budget(budget)
    return f"{b.flips} flips" if b.share is None else f"{b.value()} of the served decisions"


def over_budget(flips: int, budget, served: int) -> str:
    """A decision gate's failure in numbers: "5 flips > budget 3", or "5 flips > budget 1% of 312 served decisions
    (3)"."""
    b = parse_budget(budget)
    if b.share is None:
        return f"{flips} flips > budget {b.flips}"
    return f"{flips} flips > budget {b.value()} of {served} served decisions ({b.allowed(served)})"


def disagreement(tensor_passed: bool, decision_ok: bool) -> str:
    """'' when the gates agree; otherwise which way they disagree."""
    if tensor_passed == decision_ok:
        return ""
    if decision_ok:
        return "tensor gate blocks, decisions within budget"
    return "tensor gate passes, decisions over budget"


SHIP, SHIP_WITH_CARE, DO_NOT_SHIP, NOT_RUN, NO_VERDICT = "SHIP", "SHIP WITH CARE", "DO NOT SHIP", "NOT RUN", "NO VERDICT"


def tolerance_set(atol: float, rtol: float) -> bool:
    """Whether the tensor tolerances are the user's (not both the defaults)."""
    return (atol, rtol) != (DEFAULT_ATOL, DEFAULT_RTOL)


def ship_verdict(gates_passed: bool, flips, hosts_differ: bool | None, classes: int, compared: bool,
                 gated: bool = True) -> str:
    """The answer a verdict line opens with (docs/equiv.md defines them).

    DO NOT SHIP: a checked gate fails. SHIP: every checked gate passes, no decision flips against fp32 on any
    host (`flips`: one count per host) and the hosts serve identical decisions (`hosts_differ` False, or None
    with one host); under decode none (`compared` False), one class of bytes. SHIP WITH CARE: the gates pass,
    but decisions flip within the budget, or the hosts serve different decisions (decode none: the hosts
    compute different bytes, within the tensor tolerance). NOT RUN: no host's runtime can run it (`classes` 0):
    nothing was compared. NO VERDICT: decode none and no gate checked (no tolerance the user set): a default
    tolerance would fail every float model across architectures."""
    if classes == 0:
        return NOT_RUN
    if not compared and not gated:
        return NO_VERDICT
    if not gates_passed:
        return DO_NOT_SHIP
    if not compared:
        return SHIP if classes <= 1 else SHIP_WITH_CARE
    return SHIP if not any(flips) and not hosts_differ else SHIP_WITH_CARE


def parse_gates(text: str | None) -> list[str]:
    """--gate tensor,decision,classes -> validated names (UserError on an unknown one)."""
    if not text:
        return []
    names = [g.strip() for g in text.split(",") if g.strip()]
    bad = [g for g in names if g not in GATES]
    if bad:
        raise UserError(f"{flag_mark('gate')} {text}: unknown gate {', '.join(bad)}; choose from {', '.join(GATES)}")
    return list(dict.fromkeys(names))
