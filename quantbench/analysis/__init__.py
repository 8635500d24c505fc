"""Analysis of per-host results: pure functions over arrays and hashes.

decode     output tensors -> served decisions (per the model's sidecar)
decisions  flips against a reference, count concealment, margins
precision  |delta| and remaining precision bits between two tensors
classes    equivalence classes of hosts and the fingerprint features separating them
gates      the tensor tolerance gate and the decision gate
equiv      ties them together over the result tables (what `quantbench equiv` prints)
"""
