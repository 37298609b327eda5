"""Builds libxent.so with the repository's Makefile (`make lib`) and ships
it in xent/_lib/ (loaded with ctypes: no compiled Python extension, so the
wheel is tagged py3-none-<platform> and serves every Python 3).

Portable by default: -march is the architecture's baseline (x86-64 or
armv8-a; the library picks its AVX2 / AVX-512 paths at run time), and the
CUDA kernels are left out. Environment knobs (docs/python.md):

  XENT_SOURCE_DIR  repository root (default: the parent of this folder)
  XENT_ARCH        -march value (default: the baseline; `native` for a
                   build tuned to this machine only)
  XENT_MAKE_JOBS   parallel compile jobs (default: all cores)
  XENT_WITH_CUDA=1 also build the CUDA kernels (needs nvcc); the library
                   then finds libcudart / libcublas at run time through the
                   loader path (no rpath to the build machine's CUDA)
  XENT_NO_CUDA=1   the default; kept for compatibility

The make output is the build's progress: pip shows it with -v, and it is
copied to the terminal (/dev/tty) when there is one, so a plain
`pip install ./python` shows what it compiles."""
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:                      # setuptools < 70.1
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = pathlib.Path(__file__).resolve().parent
BASELINE_ARCH = {"x86_64": "x86-64", "amd64": "x86-64",
                 "aarch64": "armv8-a", "arm64": "armv8-a"}


# What `make lib` needs; the sdist carries it in csrc/ (a source tree of
# its own: `pip install xent_exact-*.tar.gz` builds without the repository).
C_TREE = ["Makefile", "mk", "include", "src"]


def repo_root():
    default = HERE / "csrc" if (HERE / "csrc" / "Makefile").is_file() \
        else HERE.parent
    root = pathlib.Path(os.environ.get("XENT_SOURCE_DIR") or default)
    if not (root / "include" / "xent.h").is_file():
        raise RuntimeError("xent: C sources not found at %s (set "
                           "XENT_SOURCE_DIR to the repository root)" % root)
    return root.resolve()


def with_cuda():
    if os.environ.get("XENT_WITH_CUDA") == "1":
        return True
    return False


def arch():
    a = os.environ.get("XENT_ARCH")
    if a:
        return a
    m = platform.machine().lower()
    if m not in BASELINE_ARCH:
        raise RuntimeError("xent: no baseline -march known for machine %r; "
                           "set XENT_ARCH (e.g. native)" % m)
    return BASELINE_ARCH[m]


class _Progress:
    """Writes build lines to stdout (pip's log: shown with -v or on a
    failure) and to the terminal when one is attached."""

    def __init__(self):
        self.tty = None
        if os.environ.get("XENT_BUILD_QUIET") != "1":
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None
        # pip captures stdout: when it *is* the terminal, do not print twice
        if self.tty is not None and sys.stdout.isatty():
            self.tty.close()
            self.tty = None

    def line(self, s):
        sys.stdout.write(s + "\n")
        sys.stdout.flush()
        if self.tty is not None:
            try:
                self.tty.write("xent build: " + s + "\n")
                self.tty.flush()
            except OSError:
                self.tty = None

    def close(self):
        if self.tty is not None:
            self.tty.close()


def build_library():
    """Runs `make lib` into python/build/libxent-<flavour>; returns the .so
    path."""
    cuda = with_cuda()
    march = arch()
    # separate folders: the flavours compile core.c with different flags
    out = HERE / "build" / ("libxent-%s%s" % (march, "-cuda" if cuda else ""))
    jobs = os.environ.get("XENT_MAKE_JOBS") or str(os.cpu_count() or 2)
    cmd = ["make", "-C", str(repo_root()), "-j" + jobs, "BUILD=" + str(out),
           "ARCH=" + march, "lib"]
    if cuda:
        cmd.append("CUDA_RPATH=")       # CUDA found through the loader path
    else:
        cmd.append("NVCC=")
    log = _Progress()
    log.line("building libxent (%s, -march=%s, %s jobs): %s"
             % ("with CUDA" if cuda else "CPU only", march, jobs,
                " ".join(cmd)))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    for ln in p.stdout:
        log.line(ln.rstrip("\n"))
    rc = p.wait()
    if rc != 0:
        log.line("make failed (exit %d)" % rc)
        log.close()
        raise subprocess.CalledProcessError(rc, cmd)
    log.line("libxent built in %.1f s" % (time.time() - t0))
    log.close()
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


class SdistWithC(sdist):
    """The sdist carries the C sources (csrc/) next to the package."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = repo_root()
        dst = pathlib.Path(base_dir) / "csrc"
        skip = shutil.ignore_patterns("*.o", "*.a", "*.so", "__pycache__")
        for name in C_TREE:
            src = root / name
            if src.is_dir():
                shutil.copytree(src, dst / name, ignore=skip)
            else:
                dst.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst / name)


cmdclass = {"build_py": BuildPyWithLib, "sdist": SdistWithC}
if bdist_wheel is not None:
    class BdistWheelAnyPython(bdist_wheel):
        """py3-none-<platform>: the library is loaded with ctypes, so the
        wheel does not depend on the Python version or its ABI."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheelAnyPython

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
