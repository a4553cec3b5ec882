"""Print the total of test cases over meson test logs:
"N passed, N failed, N skipped".

A test that speaks TAP (the Criterion executables) counts each TAP line (an
"ok ... # SKIP" line is a skip); a pytest run counts pytest's own summary
("3 passed, 1 skipped in 2.1s"); any other test counts as one, and meson's
SKIP result (exit status 77) as one skip. A test that failed without
reporting a failed case (a crash) adds one failure.
"""
import json
import re
import sys


def count(test):
    """(passed, failed, skipped) of one line of a meson testlog.json."""
    out = test.get("stdout") or ""
    result = test.get("result")
    if result == "SKIP":
        return 0, 0, 1
    ok = result in ("OK", "EXPECTEDFAIL")
    # Criterion writes "ok - suite::name", other TAP producers "ok 12"
    tap_skip = len(re.findall(r"^ok\b.*#\s*SKIP", out, re.M | re.I))
    tap_ok = len(re.findall(r"^ok\b", out, re.M)) - tap_skip
    tap_bad = len(re.findall(r"^not ok\b", out, re.M))
    py = re.findall(r"=+ (.*) in [\d.]+s", out)
    if tap_ok or tap_bad or tap_skip:
        p, f, s = tap_ok, tap_bad, tap_skip
    elif py:
        counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", py[-1]))
        p = counts.get("passed", 0)
        f = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        s = counts.get("skipped", 0)
    else:
        p, f, s = (1, 0, 0) if ok else (0, 1, 0)
    if not ok and f == 0:
        f = 1
    return p, f, s


def main(paths):
    passed = failed = skipped = 0
    for path in paths:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError:
            failed += 1  # the suite never ran
            continue
        for line in lines:
            p, f, s = count(json.loads(line))
            passed += p
            failed += f
            skipped += s
    return f"{passed} passed, {failed} failed, {skipped} skipped"


if __name__ == "__main__":
    print(main(sys.argv[1:]))
