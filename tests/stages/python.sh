#!/bin/sh
# `make test` stage: the Python package's tests (python/tests, pytest)
# against the library that `make all` built ($BUILD/libxent.so), plus the
# `pip install ./python` test. PyTorch tests skip where torch is absent,
# except in CI (CI=true) or with XENT_REQUIRE_TORCH=1: there a test skipped
# for want of torch (or of torch.distributed) counts as a failure, so every
# torch test runs (.ci/setup-pip.txt installs torch).
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
require_torch=0
if [ "${CI:-}" = true ] || [ "${XENT_REQUIRE_TORCH:-0}" = 1 ]; then
    require_torch=1
fi
counts=$("$PY" - "$xml" "$require_torch" <<'PYEOF'
import re, sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
s = r if r.tag == "testsuite" else r.find("testsuite")
n = lambda k: int(s.get(k, 0))
failed = n("failures") + n("errors")
skipped = n("skipped")
if sys.argv[2] == "1":
    # a skip for want of torch is a failure here (module-level skips of a
    # whole file are one <skipped> entry each, and count as one)
    torchy = re.compile(r"pytorch|torch\b|torch\.distributed|gloo", re.I)
    for tc in s.iter("testcase"):
        for sk in tc.findall("skipped"):
            why = (sk.get("message") or "") + " " + (sk.text or "")
            if torchy.search(why) and not re.search(r"\b(cuda|gpu)\b",
                                                    why, re.I):
                print("python: torch is required here (CI=true or "
                      "XENT_REQUIRE_TORCH=1) but %s.%s was skipped: %s"
                      % (tc.get("classname"), tc.get("name"),
                         why.strip()[:300]), file=sys.stderr)
                failed += 1
                skipped -= 1
print(n("tests") - n("failures") - n("errors") - n("skipped"), failed,
      skipped)
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
