"""Print the total of test cases over meson test logs: "N passed, N failed".

A test that speaks TAP (the Criterion executables) counts each TAP line; a
pytest run counts pytest's own summary; any other test counts as one. A test
that failed without reporting a failed case (a crash) adds one failure.
"""
import json
import re
import sys

passed = failed = 0
for path in sys.argv[1:]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        failed += 1  # the suite never ran
        continue
    for line in lines:
        test = json.loads(line)
        out = test.get("stdout") or ""
        ok = test.get("result") in ("OK", "EXPECTEDFAIL")
        # Criterion writes "ok - suite::name", other TAP producers "ok 12"
        # (a skipped case passed nothing)
        tap_ok = len(re.findall(r"^ok\b(?!.*# SKIP)", out, re.M))
        tap_bad = len(re.findall(r"^not ok\b", out, re.M))
        py = re.findall(r"=+ (.*) in [\d.]+s", out)
        if tap_ok or tap_bad:
            p, f = tap_ok, tap_bad
        elif py:
            counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", py[-1]))
            p = counts.get("passed", 0)
            f = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        else:
            p, f = (1, 0) if ok else (0, 1)
        if not ok and f == 0:
            f = 1
        passed += p
        failed += f
print(f"{passed} passed, {failed} failed")
