"""quantbench: what quantizing one ONNX model does on each CPU it ships to."""

__version__ = "0.1.0"
SCHEMA_VERSION = 2
