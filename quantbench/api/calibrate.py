"""`quantbench.calibrate(...)`: a calibration set balanced by strata x lighting and the fp32, dynamic and static
QDQ int8 variants (the `calibrate` command), with the command line's defaults (quantize.pipeline.CalibrateOptions)."""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.store import lazy
from quantbench.api.options import Output, check_group, check_path
from quantbench.errors import ParameterError
from quantbench.quantize.pipeline import CalibrateOptions, CalibrateResult, calibrate as run_pipeline

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_MODEL = CalibrateOptions.model
#: what a caller may choose (CalibrateOptions' fields but progress, which follows the Output group)
OPTIONS = tuple(f.name for f in dataclasses.fields(CalibrateOptions) if f.name not in ("model", "progress"))
_TYPE_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "True or False",
               os.PathLike: "a path", collections.abc.Sequence: "a list", collections.abc.Mapping: "a dict"}


@dataclass
class Calibration:
    """A calibrate run (quantize.pipeline.CalibrateResult: `.result`): its variants, their folder, the
    calibration set; `failed` the variants not published (name, why)."""

    result: CalibrateResult

    @property
    def out(self) -> Path:
        """The variants folder this run published into."""
        return Path(self.result.out)

    @property
    def failed(self) -> list:
        """The variants not published: (name, why), e.g. a smoke test that failed."""
        return list(self.result.failed)

    def variants(self) -> "pa.Table":
        """The variants this run published, for a caller choosing which to run next.

        Returns
        -------
        pyarrow.Table
            One row per published variant: name, file (absolute), method, semantic SHA-256, bytes.
        """
        rows = [{"name": r.variant.name, "file": str(Path(r.variant.path).resolve()), "method": r.variant.recipe["method"],
                 "semantic_sha256": r.variant.recipe["semantic_sha256"], "bytes": r.variant.path.stat().st_size}
                for r in self.result.reports]
        return pa.Table.from_pylist(rows, schema=pa.schema([("name", pa.string()), ("file", pa.string()),
                                                           ("method", pa.string()), ("semantic_sha256", pa.string()),
                                                           ("bytes", pa.int64())]))

    def manifest(self) -> "pa.Table | None":
        """The calibration set's manifest: which images calibrated the model, from which strata.

        Returns
        -------
        pyarrow.Table or None
            One row per selected image; None for an already-quantized model (nothing was calibrated).
        """
        if self.result.calib_dir is None:
            return None
        import pyarrow.parquet as pq

        return pq.read_table(Path(self.result.calib_dir) / "manifest.parquet")


def _check_types(chosen: dict) -> None:
    """Each option of the type its field declares (CalibrateOptions' hints: a path, whole number, number, switch,
    text or a list of them): `per_cell='2'` is a ParameterError, not a TypeError from the calibration."""
    hints = typing.get_type_hints(CalibrateOptions)
    for name, value in chosen.items():
        hint = hints[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
            typing.Union, types.UnionType) else [hint]
        if value is None and len(args) < len(typing.get_args(hint)):
            continue
        origin = [typing.get_origin(a) or a for a in args]
        if bool in origin:
            ok = isinstance(value, bool)
        elif collections.abc.Mapping in origin:
            ok = isinstance(value, collections.abc.Mapping)
        elif collections.abc.Sequence in origin:
            ok = isinstance(value, (list, tuple))
        else:
            ok = not isinstance(value, bool) and isinstance(value, tuple(origin)) or (
                float in origin and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise ParameterError(name, f"must be {' or '.join(_TYPE_WORDS.get(o, o.__name__) for o in origin)}",
                                 value)


def options(model=DEFAULT_MODEL, output: Output = Output(), **chosen) -> CalibrateOptions:
    """The pipeline's options: `chosen` by name (OPTIONS), each of its declared type, the others the command line's
    defaults."""
    unknown = sorted(set(chosen) - set(OPTIONS))
    if unknown:
        raise ParameterError(unknown[0], f"no calibrate option; choose from {', '.join(OPTIONS)}")
    check_path("model", model, optional=False)
    check_group("output", output, Output)
    _check_types(chosen)
    if not all(isinstance(t, (list, tuple)) and len(t) == 2 for t in chosen.get("types", ())):
        raise ParameterError("types", "must be (activation, weight) pairs, e.g. [('u8', 's8')]", chosen["types"])
    return CalibrateOptions(model=model, progress=output.bars(), **chosen)


def calibrate(model=DEFAULT_MODEL, output: Output = Output(), on_calset=None, on_note=None,
              **chosen) -> Calibration:
    """Calibrate and quantize `model` into its variants folder (results/variants/<model>/ unless out=...): the
    `calibrate` command, with its defaults.

    Parameters
    ----------
    model : str or path
        An .onnx file with its sidecar JSON beside it, or a bundled model's name.
    output : Output
        Progress bars and warnings.
    on_calset : callable, optional
        Called with the calibration set once it is built (before the slow part), to report it.
    on_note : callable, optional
        Called with each note (intake, defaults taken) as it happens.
    **chosen
        Any of OPTIONS (labels, images, methods, per_cell, seed, ...), each of the type its option declares.

    Returns
    -------
    Calibration
        The published variants, their folder and the calibration set; `failed` the variants not published.
    """
    return Calibration(run_pipeline(options(model, output, **chosen), on_calset=on_calset, on_note=on_note))
