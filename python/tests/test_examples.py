"""examples/grpo_tiny.py runs (2 steps, both the xent and the plain PyTorch
head) and logs finite numbers. Needs torch and transformers."""
import importlib.util
import math
import os
import pathlib

import pytest

try:
    import torch  # noqa: F401
except ImportError as e:
    pytest.skip("PyTorch is not importable (%s): the example test is "
                "skipped" % e, allow_module_level=True)
try:
    import transformers  # noqa: F401
except ImportError as e:
    if os.environ.get("CI") == "true" or \
            os.environ.get("XENT_REQUIRE_TORCH") == "1":
        raise
    pytest.skip("transformers is not importable (%s): pip install "
                "transformers" % e, allow_module_level=True)

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / \
    "grpo_tiny.py"


def load():
    spec = importlib.util.spec_from_file_location("grpo_tiny", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("impl,head", [("xent", "bf16"), ("torch", "fp32")])
def test_grpo_tiny_two_steps(impl, head):
    log = load().main(["--steps", "2", "--impl", impl, "--sampler-head",
                       head, "--groups", "2"])
    assert len(log) == 2
    for rec in log:
        for k in ("loss", "reward", "entropy", "mismatch", "k3",
                  "tis_clip"):
            assert math.isfinite(rec[k]), (k, rec)
        assert rec["mismatch"] >= 0 and rec["k3"] >= 0
        assert 0 <= rec["tis_clip"] <= 1
