"""The checked save of a hand-built graph and the MatMul + Cast chain, by the names their tests import: both live in
the model catalogue, tests/models.py."""

from models import make_model, save_model  # noqa: F401 (the catalogue: tests/models.py)
