"""Builds libxent.so with the repository's Makefile and ships it in
xent/_lib/ (loaded with ctypes: no compiled Python extension).

The repository root is the parent of this folder, or $XENT_SOURCE_DIR.
$XENT_ARCH sets the -march value (default native); $XENT_MAKE_JOBS the
number of parallel compile jobs (default: all cores); XENT_NO_CUDA=1 builds
without the CUDA kernels even where nvcc is on PATH (they are built when it
is, as `make` does)."""
import os
import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent


def repo_root():
    root = pathlib.Path(os.environ.get("XENT_SOURCE_DIR") or HERE.parent)
    if not (root / "include" / "xent.h").is_file():
        raise RuntimeError("xent: C sources not found at %s (set "
                           "XENT_SOURCE_DIR to the repository root)" % root)
    return root.resolve()


def build_library():
    """Runs `make lib` into python/build/libxent; returns the .so path."""
    no_cuda = os.environ.get("XENT_NO_CUDA") == "1"
    # separate folders: the two builds compile core.c with different flags
    out = HERE / "build" / ("libxent-nocuda" if no_cuda else "libxent")
    jobs = os.environ.get("XENT_MAKE_JOBS") or str(os.cpu_count() or 2)
    cmd = ["make", "-C", str(repo_root()), "-j" + jobs, "BUILD=" + str(out), "NO_MODEL=1",
           "lib"]
    if no_cuda:
        cmd.append("NVCC=")
    if os.environ.get("XENT_ARCH"):
        cmd.append("ARCH=" + os.environ["XENT_ARCH"])
    subprocess.check_call(cmd)
    return out / "libxent.so"


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        so = build_library()
        dest = pathlib.Path(self.build_lib) / "xent" / "_lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, dest / "libxent.so")


class BinaryDistribution(Distribution):
    """The wheel holds a native library: mark it platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLib}, distclass=BinaryDistribution)
