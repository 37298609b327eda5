#!/bin/sh
# Installs what a fresh machine lacks to build and test xent:
#   Debian packages listed in .ci/setup-packages.txt (one per line),
#   Python packages listed in .ci/setup-pip.txt (one per line).
# Idempotent and quiet when everything is present; `make test` runs it
# first. `make demo` runs `setup.sh --demo`: only the Debian packages above
# the line "# tests only" (what the CLI and the audit need), no Python
# packages. Set XENT_NO_SETUP=1 to skip it.
set -eu
[ "${XENT_NO_SETUP:-0}" = 1 ] && exit 0
cd "$(dirname "$0")/.."
demo=0
[ "${1:-}" = --demo ] && demo=1

missing=""
if [ -f .ci/setup-packages.txt ]; then
    if [ $demo = 1 ]; then
        pkgs=$(sed '/^# tests only/,$d' .ci/setup-packages.txt | grep -v '^#')
    else
        pkgs=$(grep -v '^#' .ci/setup-packages.txt)
    fi
    for p in $pkgs; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
fi
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

PY=${PYTHON:-python3}
[ $demo = 1 ] && exit 0
if [ -f .ci/setup-pip.txt ] && command -v "$PY" >/dev/null 2>&1; then
    pmissing=""
    for p in $(grep -v '^#' .ci/setup-pip.txt); do
        mod=$(echo "$p" | sed 's/[<>=].*//; s/-/_/g')
        [ "$mod" = "setuptools" ] && mod=setuptools
        "$PY" -c "import $mod" >/dev/null 2>&1 || pmissing="$pmissing $p"
    done
    if [ -n "$pmissing" ]; then
        echo "setup: installing Python packages:$pmissing"
        # torch from PyPI brings its CUDA runtime wheels (about 5 GB, 1.5 to
        # 3 min): the CPU tests need only its CPU part, but PyPI has no
        # CPU-only Linux build.
        case " $pmissing " in *" torch "*)
            echo "setup: torch is large (about 5 GB with its nvidia-* wheels); this takes a few minutes" ;;
        esac
        t0=$(date +%s)
        "$PY" -m pip install -q --progress-bar off $pmissing
        echo "setup: Python packages installed in $(( $(date +%s) - t0 )) s"
    fi
fi
