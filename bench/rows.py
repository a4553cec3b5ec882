# SPDX-License-Identifier: MIT
"""What the side-by-side benches share (bench/tms_side_by_side.py,
bench/disk.py): each row is a program run in a process of its own that prints
one `RESULT {json}` line; the rows end as a Markdown table and, if asked, a
JSON file."""
import json
import subprocess
import sys
import time


def rss_bytes():
    """This process's resident set, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_row(label, cmd, env, timeout):
    """Run one row's program: its RESULT as a dict with "label" and "wall_s",
    or {"label", "error"} when it failed, printed nothing or ran past timeout
    (the error ends with the last lines it printed)."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        # what it printed before it was killed says where it stood
        said = e.stderr or e.stdout or ""
        if isinstance(said, bytes):
            said = said.decode(errors="replace")
        tail = said.strip().splitlines()[-3:]
        return {"label": label, "error": f"no result in {timeout} s" +
                ("; last said: " + " | ".join(tail) if tail else "")}
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-6:]
        return {"label": label, "error": f"exit {r.returncode}: " + " | ".join(tail)}
    result = json.loads(line[7:])
    result["label"] = label
    result["wall_s"] = time.monotonic() - t0
    return result


def run_rows(rows, timeout):
    """run_row() each (label, cmd, env), saying each result on stderr."""
    results = []
    for label, cmd, env in rows:
        results.append(run_row(label, cmd, env, timeout))
        print(f"# {label}: {json.dumps(results[-1])[:400]}", file=sys.stderr, flush=True)
    return results


def report(results, heading, columns, summarize, json_path=None):
    """Print heading, then a Markdown table of columns with summarize(row) for
    each result; write them all to json_path. The exit status: 0 when no row
    failed."""
    print(heading)
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" for _ in columns) + " |")
    for row in results:
        print(summarize(row))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all("error" not in r for r in results) else 1
