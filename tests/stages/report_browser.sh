#!/bin/sh
# tests/stages/report_browser.sh: the HTML report of `xent audit` as a person
# sees it. A small audit (random weights at a 6-layer, 64-wide Llama shape,
# 64 tokens, the default variants: well under a second) writes a report,
# which headless Chromium loads through its DevTools protocol (a pipe, no
# network port). Checks:
#   - no console error, uncaught exception or failed load (Runtime and Log
#     events of level error);
#   - the first screen (1280 x 1000) is not blank: at least 16 distinct
#     colours and 1% of its pixels not white (the PNG decoded with zlib);
#   - the verdict is on the first screen and says, for every variant, which
#     budget it is within (or that it is over every budget);
#   - one histogram per variant, no script, no directory of any path.
# Two controls show the checks can fail: a page with a console.error and a
# missing image must give errors, and a blank page must be found blank.
# Without Chromium (chromium, chromium-browser, google-chrome, or $CHROMIUM)
# the stage says so and counts as skipped, except under CI=true, where that
# is a failure (.ci/setup-packages.txt installs chromium).
# Prints "N passed, N failed[, N skipped]" last.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
XENT="$BUILD/xent"
browser=${CHROMIUM:-}
if [ -z "$browser" ]; then
    for c in chromium chromium-browser google-chrome google-chrome-stable chrome; do
        if command -v "$c" >/dev/null 2>&1; then browser=$(command -v "$c"); break; fi
    done
fi
if [ -z "$browser" ]; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL report_browser: no Chromium (chromium, chromium-browser, google-chrome; or set CHROMIUM); CI installs chromium (.ci/setup-packages.txt)"
        echo "0 passed, 1 failed"; exit 1
    fi
    echo "report_browser: no Chromium here (chromium, chromium-browser, google-chrome; or set CHROMIUM): skipped"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if [ ! -x "$XENT" ]; then echo "FAIL $XENT not built"; echo "0 passed, 1 failed"; exit 1; fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "FAIL report_browser: python3 is needed to drive the browser"; echo "0 passed, 1 failed"; exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/tiny.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "initializer_range": 0.2}
JSON
audit_rc=0
"$XENT" audit --init random --config "$tmp/tiny.json" --seq-len 64 --threads 1 --quiet \
    --html "$tmp/report.html" > "$tmp/audit.out" 2>&1 || audit_rc=$?
printf '<!DOCTYPE html><html><body><p>x</p><script>console.error("control")</script><img src="missing.png"></body></html>\n' > "$tmp/bad.html"
printf '<!DOCTYPE html><html><body></body></html>\n' > "$tmp/blank.html"
cat > "$tmp/cdp.py" <<'PY'
import base64, json, os, select, subprocess, sys, time, zlib


def png_stats(data):
    """(width, height, distinct colours, fraction of non-white pixels) of an
    8-bit RGB/RGBA PNG, decoded with zlib alone."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        typ = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if typ == b"IHDR":
            w, h = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
            depth, ctype, interlace = body[8], body[9], body[12]
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("PNG kind %d/%d/%d not handled" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        elif typ == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    colours, nonwhite, i = set(), 0, 0
    for y in range(h):
        f = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + b) & 255
            elif f == 3: line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pr) & 255
        for x in range(0, stride, bpp):
            px = bytes(line[x:x + 3])
            colours.add(px)
            if px != b"\xff\xff\xff":
                nonwhite += 1
        prev = line
    return w, h, len(colours), nonwhite / float(w * h)


class Browser:
    def __init__(self, exe, width, height):
        r_cmd, w_cmd = os.pipe()   # we write commands, the browser reads fd 3
        r_out, w_out = os.pipe()   # the browser writes fd 4, we read

        def child():
            # through fresh descriptors: the pipe ends may already be 3 or 4,
            # and os.pipe's ends do not survive exec
            a, b = os.dup(r_cmd), os.dup(w_out)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.p = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", "--no-first-run", "--disable-extensions",
             "--window-size=%d,%d" % (width, height), "about:blank"],
            close_fds=False, preexec_fn=child,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r_cmd)
        os.close(w_out)
        self.w, self.r = w_cmd, r_out
        self.buf, self.next_id, self.events = b"", 0, []

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.p.wait(timeout=5)
        except Exception:
            self.p.kill()

    def _read(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("the browser did not answer")
            rd, _, _ = select.select([self.r], [], [], left)
            if rd:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise EOFError("the browser closed its pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=20):
        self.next_id += 1
        m = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self.w, json.dumps(m).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method, timeout=20):
        deadline = time.time() + timeout
        for k, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(k)
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)


def render(exe, url, png_out, width=1280, height=1000):
    """Loads url; returns (errors, stats, facts): the console / log errors
    and uncaught exceptions, png_stats of the first screen, and what the
    page shows on it."""
    b = Browser(exe, width, height)
    try:
        targets = b.send("Target.getTargets")["targetInfos"]
        page = [t for t in targets if t["type"] == "page"][0]["targetId"]
        s = b.send("Target.attachToTarget", {"targetId": page, "flatten": True})["sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable"):
            b.send(m, session=s)
        b.send("Emulation.setDeviceMetricsOverride",
               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
               session=s)
        b.send("Page.navigate", {"url": url}, session=s)
        b.wait_event("Page.loadEventFired")
        time.sleep(0.3)  # late console messages
        shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)
        data = base64.b64decode(shot["data"])
        with open(png_out, "wb") as f:
            f.write(data)
        expr = ("JSON.stringify({verdict_top: (document.getElementById('verdict') || "
                "{getBoundingClientRect: () => ({top: -1})}).getBoundingClientRect().top, "
                "inner: window.innerHeight, text: document.body ? "
                "document.body.innerText.slice(0, 4000) : '', "
                "svgs: document.querySelectorAll('svg.hist').length, "
                "scripts: document.scripts.length})")
        ev = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=s)
        facts = json.loads(ev["result"]["value"])
        b.send("Runtime.evaluate", {"expression": "1"}, session=s)  # flush events
        errors = []
        for e in b.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console.%s: %s" % (p["type"], " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", []))))
            elif m == "Runtime.exceptionThrown":
                errors.append("exception: %s" % p.get("exceptionDetails", {}).get("text"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                en = p["entry"]
                errors.append("%s: %s %s" % (en.get("source"), en.get("text"), en.get("url", "")))
        return errors, png_stats(data), facts
    finally:
        b.close()




def main():
    exe, tmp, audit_rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
    passed = failed = 0

    def check(ok, what, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print("ok   " + what)
        else:
            failed += 1
            print("FAIL " + what + (": " + detail if detail else ""))

    report = os.path.join(tmp, "report.html")
    check(audit_rc == 0 and os.path.exists(report), "xent audit wrote the report",
          "exit %d: %s" % (audit_rc, open(os.path.join(tmp, "audit.out")).read()[-2000:]))
    if os.path.exists(report):
        html = open(report, encoding="utf-8").read()
        check(tmp not in html and "/tmp/" not in html, "no directory of a path in the page")
        try:
            t0 = time.time()
            errors, (w, h, colours, ink), facts = render(exe, "file://" + report,
                                                        os.path.join(tmp, "report.png"))
            print("     rendered in %.1f s: %dx%d, %d colours, %.1f%% not white"
                  % (time.time() - t0, w, h, colours, 100 * ink))
            check(not errors, "no console error", "; ".join(errors))
            check(colours >= 16 and ink >= 0.01, "the first screen is not blank",
                  "%d colours, %.2f%% not white" % (colours, 100 * ink))
            top = facts.get("verdict_top", -1)
            check(0 <= top < facts.get("inner", 0) * 0.5, "the verdict is on the first screen",
                  "its heading at y = %s" % top)
            text = facts.get("text", "")
            names = ["bf16", "bf16_fp32head", "fp16", "fp16_fp32head"]
            said = [n for n in names if ("%s is within the" % n) in text or
                    ("%s is over every budget" % n) in text]
            check(said == names, "the verdict names a budget for every variant",
                  "said for %s" % said)
            check(facts.get("svgs") == len(names), "one histogram per variant",
                  "%s histograms" % facts.get("svgs"))
            check(facts.get("scripts") == 0, "no script in the page")
        except Exception as e:
            check(False, "the browser rendered the report", repr(e))
    try:
        errors, _, _ = render(exe, "file://" + os.path.join(tmp, "bad.html"),
                              os.path.join(tmp, "bad.png"))
        check(any("control" in e for e in errors) and any("missing.png" in e for e in errors),
              "control: a console.error and a missing image are caught", "; ".join(errors))
        _, (w, h, colours, ink), _ = render(exe, "file://" + os.path.join(tmp, "blank.html"),
                                            os.path.join(tmp, "blank.png"))
        check(not (colours >= 16 and ink >= 0.01), "control: a blank page is found blank",
              "%d colours, %.2f%% not white" % (colours, 100 * ink))
    except Exception as e:
        check(False, "the browser rendered the controls", repr(e))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


sys.exit(main())
PY
python3 "$tmp/cdp.py" "$browser" "$tmp" "$audit_rc"
