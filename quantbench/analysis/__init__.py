"""Analysis of per-host results: from output hashes and tensors to classes, decisions and accuracy.

decode     output tensors -> served decisions (per the model's sidecar)
decisions  flips against a reference, count concealment, margins
precision  |delta| and remaining precision bits between two tensors
classes    equivalence classes of hosts and the fingerprint features separating them
tiers      CPU tiers as onnxruntime's kernel dispatch reads them: the ISA flags it reads (in MLAS's order),
           the flags qemu evidence families show, each host's U8S8 int8 path (saturating or exact)
gates      the tensor tolerance gate and the decision gate
equiv      ties them together over the result tables (what `quantbench equiv` prints) and appends the
           classes, decisions and flips tables
accuracy   detection AP and text accuracy of served decisions against the labels (metrics: the COCO
           evaluator and text scores)
resultcache  analysis results kept as files under the content key of their inputs

decode, decisions, precision, classes, tiers and gates are pure functions over arrays and hashes; equiv
(its tables), accuracy (its score cache) and resultcache write files under the results folder.
"""
