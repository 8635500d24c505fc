"""Release records: semantic artifact hash, ONNX diff, release key registry, verify.

A release record carries the recipe, the builder environment, the artifact
hashes (raw and semantic) and a behavioural measurement on each target,
because neither the recipe nor the bytes alone identify what a model does.
"""

from __future__ import annotations
