"""The package works where torch is absent: `import xent` and
`from xent import *` succeed and the NumPy API runs; torch-only names say
that they need torch. Each case runs in a subprocess whose torch is
hidden (sys.modules["torch"] = None, which makes `import torch` raise
ImportError as if it were not installed)."""
import os
import pathlib
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]

HIDE = "import sys; sys.modules['torch'] = None\n"


def run(code, tmp_path):
    env = dict(os.environ)
    if env.get("XENT_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(
            [str(CHECKOUT)] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", HIDE + code], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_import_and_star_import_without_torch(tmp_path):
    out = run("import xent\n"
              "from xent import *\n"
              "import numpy as np\n"
              "assert 'torch' not in [m for m, v in sys.modules.items() "
              "if v is not None]\n"
              "assert 'CrossEntropyLoss' not in xent.__all__\n"
              "z = np.array([[0., 1., 2.], [3., 3., 3.]], np.float32)\n"
              "l = cross_entropy(z, np.array([2, 0]), reduction='none')\n"
              "want = [np.log(1 + np.exp(-1.) + np.exp(-2.)), np.log(3.)]\n"
              "assert np.allclose(l, want, rtol=1e-6, atol=0), l\n"
              "lp = logprobs(z, np.array([2, 0]))\n"
              "assert np.allclose(-lp, want, rtol=1e-6, atol=0), lp\n"
              "assert cuda_available() is False\n"
              "print('ok')\n", tmp_path)
    assert out.strip() == "ok"


def test_torch_only_names_explain_without_torch(tmp_path):
    out = run("import xent\n"
              "try:\n"
              "    xent.CrossEntropyLoss\n"
              "except ImportError as e:\n"
              "    assert 'needs PyTorch' in str(e), e\n"
              "    print('ok')\n", tmp_path)
    assert out.strip() == "ok"


def test_torch_present_adds_the_autograd_api(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    import xent
    assert "CrossEntropyLoss" in xent.__all__
    ns = {}
    exec("from xent import *", ns)
    assert "CrossEntropyLoss" in ns and "cross_entropy" in ns
