"""The calibration methods: one table, name -> CalibrationKind (its onnxruntime CalibrationMethod member, whether
it calibrates from histograms, the options a user sets for it with their defaults).

Every other module asks this table (calibrate's choices, the recipe's calibration_options, which options a
method takes); quantbench.quantize.ort_api turns a name into onnxruntime's enum and back, and
quantbench.quantize.calibration computes each method's ranges.

Adding a method: one CalibrationKind below, its range computation in calibration.py (_tensors_data) and, when
onnxruntime has no enum member of that name, its case in ort_api.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PERCENTILE = 99.999
PERCENTILE_BINS = 2048        # onnxruntime's create_calibrator default for Percentile
ENTROPY_BINS = 128            # onnxruntime's default histogram bins for Entropy
ENTROPY_QUANTIZED_BINS = 128  # onnxruntime's default quantized bins for Entropy


@dataclass(frozen=True)
class CalibrationKind:
    """One calibration method."""

    name: str
    #: the onnxruntime.quantization.calibrate.CalibrationMethod member (quantbench.quantize.ort_api)
    ort_member: str
    #: ranges come from histograms of the activations (else from their extremes)
    histogram: bool = False
    #: (option, default) a user sets for it, recorded in its variants' calibration_options
    options: tuple = ()

    def takes(self, option: str) -> bool:
        return option in dict(self.options)


#: every static calibration method, in the order help, errors and calibrate's variants list them
METHODS = {m.name: m for m in (
    CalibrationKind("minmax", "MinMax"),
    CalibrationKind("percentile", "Percentile", True, (("percentile", DEFAULT_PERCENTILE),)),
    CalibrationKind("entropy", "Entropy", True, (("entropy_bins", ENTROPY_BINS),)),
)}
STATIC = tuple(METHODS)
#: the variant quantized without calibration (onnxruntime's quantize_dynamic)
DYNAMIC = "dynamic"
#: what calibrate can make besides fp32 (its --methods choices)
VARIANT_METHODS = (DYNAMIC, *STATIC)
#: what calibrate makes when no methods are named: not entropy, which at onnxruntime's default bins has a single KL
#: candidate, so gives MinMax's range (a byte duplicate of static-minmax on every acceptance model, at several times
#: MinMax's calibration time: scripts/bench_entropy.py, docs/benchmarks.md "Entropy calibration")
DEFAULT_METHODS = (DYNAMIC, "minmax", "percentile")


def takes(method: str, option: str) -> bool:
    """Whether static calibration `method` takes `option` (False for an unknown method)."""
    return method in METHODS and METHODS[method].takes(option)


def wanted(methods, option: str) -> bool:
    """Whether any of `methods` takes `option`."""
    return any(takes(m, option) for m in methods)
