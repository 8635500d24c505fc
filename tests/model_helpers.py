"""The checked save of a hand-built graph, the MatMul + Cast chain and the transformer-like classifier, by the
names their tests import: they live in the model catalogue, tests/models.py."""

from models import make_model, save_model, transformer_like_classifier  # noqa: F401 (the catalogue: tests/models.py)
