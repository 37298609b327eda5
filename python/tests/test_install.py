"""Packaging: `pip install ./python`, `pip wheel ./python` and the sdist
build libxent (portable: -march=x86-64 baseline, no CUDA, no rpath) and
ship it inside the package; the wheel installs into a fresh venv and
passes tests there.

Slow-ish (each build compiles the library, a few seconds to a minute on 2
cores): runs when XENT_TEST_INSTALL=1 (the `make test` stage sets it),
skipped otherwise."""
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python"
DIST = "xent_exact"          # the distribution's file-name form (xent-exact)
BASELINE = {"x86_64": "x86-64", "aarch64": "armv8-a"}.get(platform.machine())

pytestmark = pytest.mark.skipif(
    os.environ.get("XENT_TEST_INSTALL") != "1",
    reason="set XENT_TEST_INSTALL=1 to test pip install")

SMOKE = ("import numpy as np, xent; "
         "assert xent.library_path() == %r, xent.library_path(); "
         "assert xent.abi_mismatches() == []; "
         "l = xent.cross_entropy(np.zeros((2, 4), np.float32), "
         "np.array([1, 3])); "
         "assert abs(float(l) - float(np.log(4.0))) < 1e-6, l; "
         "print('ok', xent.version())")


def build_env():
    """A CPU-only build (the default) unless XENT_TEST_INSTALL_CUDA=1: nvcc
    takes minutes, and the CUDA build is what `make` itself tests."""
    env = dict(os.environ, XENT_MAKE_JOBS=os.environ.get("XENT_MAKE_JOBS",
                                                         "2"))
    env.pop("XENT_NO_CUDA", None)
    env.pop("XENT_ARCH", None)
    env.pop("XENT_LIBRARY", None)
    if os.environ.get("XENT_TEST_INSTALL_CUDA") == "1":
        env["XENT_WITH_CUDA"] = "1"
    else:
        env.pop("XENT_WITH_CUDA", None)
    return env


def pip(*args, cwd, env=None, python=sys.executable):
    t0 = time.time()
    out = subprocess.run([str(python), "-m", "pip"] + list(args),
                         env=env or build_env(), cwd=str(cwd),
                         capture_output=True, text=True)
    dt = time.time() - t0
    assert out.returncode == 0, "pip %s failed:\n%s\n%s" % (
        " ".join(args), out.stdout[-4000:], out.stderr[-4000:])
    return out.stdout + out.stderr, dt


def readelf_dynamic(so):
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed (binutils)")
    return subprocess.run(["readelf", "-d", str(so)], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """`pip wheel ./python` once for the module: (path, pip output)."""
    d = tmp_path_factory.mktemp("wheel")
    log, dt = pip("wheel", "-v", "--no-deps", "--no-build-isolation", "-w",
                  str(d), str(PKG), cwd=d)
    print("pip wheel ./python: %.1f s" % dt)
    wheels = sorted(d.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], log


def test_pip_install_builds_and_ships_the_library(tmp_path):
    target = tmp_path / "site"
    log, dt = pip("install", "-v", "--no-build-isolation", "--no-deps",
                  "--target", str(target), str(PKG), cwd=tmp_path)
    print("pip install ./python: %.1f s" % dt)
    # the progress: setup.py's make lines reach pip's (verbose) log
    assert "building libxent" in log and "libxent built in" in log, log[-2000:]
    so = target / "xent" / "_lib" / "libxent.so"
    assert so.is_file()
    out = subprocess.run([sys.executable, "-c", SMOKE % str(so)],
                         env=dict(build_env(), PYTHONPATH=str(target)),
                         cwd=str(tmp_path), check=True, capture_output=True,
                         text=True)
    assert out.stdout.startswith("ok"), out.stdout


def test_wheel_is_one_portable_wheel(wheel, tmp_path):
    path, log = wheel
    name = path.name
    # ctypes, no extension module: one wheel for every Python 3
    assert name.startswith(DIST + "-") and "-py3-none-linux_" in name, name
    with zipfile.ZipFile(path) as z:
        sos = [n for n in z.namelist() if n.endswith(".so")]
        assert sos == ["xent/_lib/libxent.so"], sos
        z.extract("xent/_lib/libxent.so", str(tmp_path))
        meta = [n for n in z.namelist() if n.endswith("METADATA")]
        text = z.read(meta[0]).decode()
    assert "Name: xent-exact" in text, text[:300]
    # compiled for the baseline, never for the build machine
    # (the make command line; its compile lines when objects were stale)
    if BASELINE:
        assert " ARCH=%s " % BASELINE in log, log[-3000:]
    assert "-march=native" not in log and "ARCH=native" not in log
    dyn = readelf_dynamic(tmp_path / "xent" / "_lib" / "libxent.so")
    assert "RPATH" not in dyn and "RUNPATH" not in dyn, dyn
    if os.environ.get("XENT_TEST_INSTALL_CUDA") != "1":
        assert "libcudart" not in dyn and "libcublas" not in dyn, dyn


def test_wheel_installs_and_passes_tests_in_a_fresh_venv(wheel, tmp_path):
    path, _ = wheel
    venv = tmp_path / "venv"
    # numpy/pytest (and torch, when installed) come from the system
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    str(venv)], check=True)
    py = venv / "bin" / "python"
    env = build_env()
    env.pop("PYTHONPATH", None)
    # as on a machine without a compiler: nothing on PATH but the venv's
    # own programs, no CC / CXX / nvcc to find
    env["PATH"] = str(venv / "bin")
    env["CC"] = env["CXX"] = "/nonexistent/cc"
    for tool in ("cc", "gcc", "clang", "c++", "nvcc", "make"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    pip("install", "--no-deps", "--no-index", str(path), cwd=tmp_path,
        env=env, python=py)
    # the wheel's copy, not the checkout's: run from elsewhere
    so = subprocess.run(
        [str(py), "-c", "import xent; print(xent.library_path())"],
        env=env, cwd=str(tmp_path), check=True, capture_output=True,
        text=True).stdout.strip()
    assert so.startswith(str(venv)), so
    out = subprocess.run([str(py), "-c", SMOKE % so], env=env,
                         cwd=str(tmp_path), check=True, capture_output=True,
                         text=True)
    assert out.stdout.startswith("ok"), out.stdout
    # a few of the package's own tests against the installed copy
    # (XENT_TEST_INSTALLED=1: conftest.py does not put the checkout first)
    tests = PKG / "tests"
    env = dict(env, XENT_TEST_INSTALLED="1", XENT_TEST_INSTALL="0")
    r = subprocess.run([str(py), "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", str(tests / "test_numpy.py"),
                        str(tests / "test_no_torch.py")],
                       env=env, cwd=str(tmp_path), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout


def test_sdist_carries_the_c_sources_and_builds(tmp_path):
    """The sdist holds csrc/ (Makefile, mk, include, src): pip builds it
    without the repository around it."""
    sd = tmp_path / "sdist"
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d",
                    str(sd)], cwd=str(PKG), check=True, capture_output=True,
                   env=build_env())
    tars = sorted(sd.glob(DIST + "-*.tar.gz"))
    assert len(tars) == 1, tars
    target = tmp_path / "site"
    log, dt = pip("install", "-v", "--no-build-isolation", "--no-deps",
                  "--target", str(target), str(tars[0]), cwd=tmp_path)
    print("pip install sdist: %.1f s" % dt)
    assert "/csrc" in log and str(ROOT) + " " not in log, log[-2000:]
    so = target / "xent" / "_lib" / "libxent.so"
    out = subprocess.run([sys.executable, "-c", SMOKE % str(so)],
                         env=dict(build_env(), PYTHONPATH=str(target)),
                         cwd=str(tmp_path), check=True, capture_output=True,
                         text=True)
    assert out.stdout.startswith("ok"), out.stdout
