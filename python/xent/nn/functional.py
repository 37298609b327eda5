"""`import xent.nn.functional as F; F.cross_entropy(...)`: torch's
F.cross_entropy over libxent (xent/_dropin.py)."""
from .._dropin import cross_entropy

__all__ = ["cross_entropy"]
