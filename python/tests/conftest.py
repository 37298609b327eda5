"""Test set-up: import the package from this checkout (python/xent) unless
XENT_TEST_INSTALLED=1 asks for the installed one; the library comes from
$XENT_LIBRARY, xent/_lib/ or ../build/libxent.so (see xent/_capi.py)."""
import os
import pathlib
import sys

import numpy as np
import pytest

_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
if os.environ.get("XENT_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(_CHECKOUT))
else:                     # the installed package, never this checkout's
    import xent as _xent
    _where = pathlib.Path(_xent.__file__).resolve()
    assert _CHECKOUT not in _where.parents, \
        "XENT_TEST_INSTALLED=1 but xent comes from the checkout: %s" % _where

SEED = int(os.environ.get("XENT_TEST_SEED", "0") or 0) or \
    int.from_bytes(os.urandom(4), "little")


def pytest_report_header(config):
    return "xent test seed: XENT_TEST_SEED=%d" % SEED


def pytest_terminal_summary(terminalreporter):
    """The seed again at the end, where -q runs (make test's) show it."""
    terminalreporter.write_line("xent test seed: XENT_TEST_SEED=%d" % SEED)


@pytest.fixture
def rng(request):
    """A generator seeded from the run seed and the test's name, so each
    test's inputs can be replayed with XENT_TEST_SEED."""
    h = sum(ord(c) * 31 ** i for i, c in enumerate(request.node.name))
    return np.random.default_rng([SEED, h % (2 ** 32)])
