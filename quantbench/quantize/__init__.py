"""Quantization: memory-bounded, order-independent calibration ranges
(`calibration`) and fp32/dynamic/static-QDQ variants with recipes (`variants`).

Heavy imports (onnxruntime) happen inside the submodules, so importing this
package is cheap.
"""
