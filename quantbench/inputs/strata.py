"""Strata of labelled images, named from the user's data, not from any demo.

Two kinds of stratum, one owner for both the calibration set and the fixtures:
  objects   by how many labelled objects an image holds: "empty" (none) or
            "objects"; with count bins, "objects-1-2", "objects-3+" ...
  label     by the image's one label (a classifier's COCO labels: one
            annotation per image, no bbox; or a CSV 'label' column).
"auto" picks label strata when every image carries exactly one label, else
object strata.
"""

from __future__ import annotations

from typing import Sequence

from quantbench.errors import UserError, flag_mark

EMPTY = "empty"
OBJECTS = "objects"
MODES = ("auto", "objects", "label")


def density_label(objects: int, count_bins: Sequence[int] = ()) -> str:
    """'empty', 'objects', or with count bins 'objects-<lo>-<hi>' / 'objects-<n>' / 'objects-<last>+'."""
    if objects <= 0:
        return EMPTY
    if not count_bins:
        return OBJECTS
    edges = [1, *sorted(count_bins)]
    for lo, hi in zip(edges, edges[1:]):
        if lo <= objects < hi:
            return f"{OBJECTS}-{lo}" if hi - lo == 1 else f"{OBJECTS}-{lo}-{hi - 1}"
    return f"{OBJECTS}-{edges[-1]}+"


def density_classes(count_bins: Sequence[int] = ()) -> list[str]:
    """Every object stratum the bins can produce, sorted, 'empty' last."""
    if not count_bins:
        return [OBJECTS, EMPTY]
    edges = [1, *sorted(count_bins)]
    return sorted({density_label(lo, count_bins) for lo in edges}) + [EMPTY]


def clean_label(name) -> str:
    """A label usable inside a cell name ('<stratum>/<lighting>')."""
    text = str(name).strip().replace("/", "_")
    if not text:
        raise UserError(f"label {name!r} is empty; every label needs a name")
    return text


def single_label(annotations: list, category_names: dict) -> str | None:
    """The image's label when it carries exactly one annotation without a box (a classifier's label), else None."""
    if len(annotations) != 1 or annotations[0].get("bbox") is not None:
        return None
    cid = annotations[0].get("category_id")
    return clean_label(category_names.get(cid, cid))


def resolve_mode(mode: str, labels: Sequence[str | None]) -> str:
    """'auto' -> 'label' when every image has a label, else 'objects'; an explicit mode is checked."""
    if mode not in MODES:
        raise UserError(f"{flag_mark('strata')} {mode}: choose one of {', '.join(MODES)}")
    if mode == "auto":
        return "label" if labels and all(lb is not None for lb in labels) else "objects"
    if mode == "label" and any(lb is None for lb in labels):
        raise UserError(f"{flag_mark('strata')} label: some images do not carry exactly one label (one annotation without a bbox, "
                        f"or a CSV 'label' value); use {flag_mark('strata')} objects")
    return mode


def stratum_of(objects: int, label: str | None, mode: str, count_bins: Sequence[int] = ()) -> str:
    return label if mode == "label" else density_label(objects, count_bins)
