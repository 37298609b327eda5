#!/bin/sh
# `make test` stage: the Python package's tests (python/tests, pytest)
# against the library that `make all` built ($BUILD/libxent.so), plus the
# `pip install ./python` test. PyTorch tests skip where torch is absent.
# Last line: "N passed, N failed, N skipped".
set -u
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
if ! "$PY" -c "import numpy, pytest" 2>/dev/null; then
    echo "python: numpy or pytest is not installed (see .ci/setup-pip.txt): skipped"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
xml=$(mktemp); trap 'rm -f "$xml"' EXIT
cd "$root/python" || exit 1
case "$BUILD" in /*) lib=$BUILD/libxent.so ;; *) lib=$root/$BUILD/libxent.so ;; esac
XENT_LIBRARY=${XENT_LIBRARY:-$lib} XENT_TEST_INSTALL=${XENT_TEST_INSTALL:-1} \
    "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$xml" tests
rc=$?
# Counts from the JUnit XML (errors count as failures); exit 5 = no tests.
counts=$("$PY" - "$xml" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
s = r if r.tag == "testsuite" else r.find("testsuite")
n = lambda k: int(s.get(k, 0))
failed = n("failures") + n("errors")
print(n("tests") - failed - n("skipped"), failed, n("skipped"))
PYEOF
)
set -- $counts
passed=$1; failed=$2; skipped=$3
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$failed" -eq 0 ]; then
    echo "python: pytest exited $rc without a failed test: counted as 1 failure"
    failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
