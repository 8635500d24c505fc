"""A model's inputs: its sidecar and input recipe, its variants as calibrate published them, images to tensors,
plug-ins and their consent, strata names, the ONNX file's facts and hashes, labels and fixtures; and the bundled
demo's paths.
"""
