"""Drop-ins for torch.nn's cross-entropy with torch's exact signature and
layout (class dimension 1): `xent.nn.CrossEntropyLoss` and
`xent.nn.functional.cross_entropy` (needs torch; see xent/_dropin.py)."""
from . import functional
from .._dropin import CrossEntropyLoss

__all__ = ["CrossEntropyLoss", "functional"]
