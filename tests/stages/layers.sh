#!/bin/sh
# tests/stages/layers.sh: the layers of docs/architecture.md hold.
#   1. libxent.so exports the functions declared XENT_API in include/ and
#      nothing else (nm -D --defined-only).
#   2. libxent (src/core, cpu, cuda, io, rl) includes nothing of the tools
#      (src/model, audit, compare) nor of tools/.
#   3. The tools (src/model, audit, compare) and the CLI (tools/) include of
#      libxent only its public headers and the header-only
#      src/core/xent_math.h, and link no private libxent symbol (xent__*).
#   4. Nothing in src/ reads the environment (choices go through the API).
#   5. No source file of src/ belongs to an experiment (dev/ holds those):
#      every .c/.cu of src/ is one the Makefile builds into a library.
# Prints "N passed, N failed" last.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/     /' | head -20; }

so=$BUILD/libxent.so
if [ -f "$so" ]; then
    api=$(mktemp); exp=$(mktemp); trap 'rm -f "$api" "$exp"' EXIT
    # names declared XENT_API (the name is the identifier before the first '(')
    grep -h '^XENT_API' include/xent.h include/xent/*.h |
        sed -E 's/\(.*//; s/.*[ *]([A-Za-z_][A-Za-z0-9_]*)$/\1/' | sort -u > "$api"
    nm -D --defined-only "$so" | awk '{print $3}' | sed 's/@.*//' | sort -u > "$exp"
    extra=$(comm -13 "$api" "$exp")
    missing=$(comm -23 "$api" "$exp")
    [ -z "$extra" ] && ok "libxent.so exports only XENT_API functions ($(wc -l < "$exp") symbols)" \
                    || bad "libxent.so exports symbols that are not public API" "$extra"
    [ -z "$missing" ] && ok "libxent.so exports every XENT_API function ($(wc -l < "$api"))" \
                      || bad "XENT_API functions missing from libxent.so" "$missing"
else
    bad "$so not built"
fi

inc=$(grep -nE '#include +"(model|audit|compare)/' src/core src/cpu src/cuda src/io src/rl -r)
[ -z "$inc" ] && ok "libxent includes nothing of the tools" || bad "libxent includes the tools" "$inc"

inc=$(grep -nE '#include +"(core|cpu|cuda|io|rl)/' src/model src/audit src/compare tools -r |
      grep -v '"core/xent_math.h"')
[ -z "$inc" ] && ok "the tools include only libxent's public headers (and core/xent_math.h)" \
              || bad "the tools include libxent's private headers" "$inc"
inc=$(grep -nE '#include +"[a-z_]+_internal.h"' src/model src/audit src/compare tools -r |
      grep -v 'model_internal.h')
[ -z "$inc" ] && ok "the tools include no *_internal.h of libxent" || bad "private header in the tools" "$inc"

if [ -f "$BUILD/libxent_tools.a" ] && [ -f "$BUILD/libxent.a" ]; then
    need=$(nm -u "$BUILD/libxent_tools.a" $BUILD/tools/*.o 2>/dev/null | awk '{print $2}' | grep '^xent__' | sort -u)
    have=$(nm --defined-only "$BUILD/libxent_tools.a" | awk '{print $3}' | grep '^xent__' | sort -u)
    priv=$(printf '%s\n' "$need" | grep -vxF "$have" | grep .)
    [ -z "$priv" ] && ok "the tools and the CLI link no private libxent symbol" \
                   || bad "the tools link private libxent symbols" "$priv"
else
    bad "$BUILD/libxent_tools.a or libxent.a not built"
fi

env=$(grep -rn 'getenv' src/ --include='*.c' --include='*.h' --include='*.cu')
[ -z "$env" ] && ok "nothing in src/ reads the environment" || bad "getenv in src/" "$env"

# every source of src/ is built: the library's folders and the stubs
orphans=""
for f in $(find src -name '*.c' -o -name '*.cu'); do
    case "$f" in
    src/core/*|src/cpu/*|src/io/*|src/rl/*|src/cuda/*|src/model/*|src/audit/*|src/compare/*) ;;
    *) orphans="$orphans $f" ;;
    esac
done
[ -z "$orphans" ] && ok "every source in src/ belongs to a library folder" || bad "sources outside the layers" "$orphans"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
