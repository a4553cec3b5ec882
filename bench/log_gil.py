#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What the embedded server's access log costs a Python trainer that holds the GIL.

A child process makes a host-backend dormant.Manager, serves it
(Manager.serve(), quiet or not) and runs --hogs threads spinning in pure
Python, as a trainer's loop holds the GIL. This process sends --requests GET
/healthz on one kept connection and times each answer. Rows:

  quiet              serve(quiet=True): no access log
  log, not shown     the access log on, the logger "dormant.server" left at
                     Python's default (WARNING: the lines are dropped there)
  log, INFO          logging.basicConfig(level=INFO) in the child (to /dev/null)

Only the standard library and dormant. Usage:
  bench/log_gil.py [--lib build/libdormant.so] [--requests 400] [--hogs 2]
Prints a table (median and 90th percentile per request, ms) and one line of
JSON last.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import logging, os, sys, threading, time
import dormant
quiet, level = sys.argv[1] == "quiet", sys.argv[2]
if level == "info":
    logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))
m = dormant.Manager(backend="host")
s = m.serve(quiet=quiet, port=0)
stop = False
def hog():
    x = 0
    while not stop:
        x += 1
for _ in range(int(sys.argv[3])):
    threading.Thread(target=hog, daemon=True).start()
print(s.port, flush=True)
sys.stdin.readline()
stop = True
s.stop()
"""


def run_row(args, quiet, level):
    env = dict(os.environ)
    env["DORMANT_LIB"] = os.path.abspath(args.lib)
    env["PYTHONPATH"] = os.path.join(HERE, "..", "python") + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "quiet" if quiet else "log", level, str(args.hogs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        port = int(child.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        times = []
        for _ in range(args.requests):
            start = time.perf_counter()
            conn.request("GET", "/healthz")
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise SystemExit(f"/healthz answered {answer.status}")
            times.append(time.perf_counter() - start)
        conn.close()
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=60)
    times.sort()
    n = len(times)
    return {"median_ms": times[n // 2] * 1e3, "p90_ms": times[int(n * 0.9)] * 1e3}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=os.path.join(HERE, "..", "build", "libdormant.so"))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--hogs", type=int, default=2)
    args = p.parse_args()
    rows = {}
    for name, quiet, level in (("quiet", True, "default"), ("log, not shown", False, "default"),
                               ("log, INFO", False, "info")):
        rows[name] = run_row(args, quiet, level)
    print(f"{'row':<16} {'median ms':>10} {'p90 ms':>8}")
    for name, r in rows.items():
        print(f"{name:<16} {r['median_ms']:>10.2f} {r['p90_ms']:>8.2f}")
    print(json.dumps({"requests": args.requests, "hogs": args.hogs, "rows": rows}))


if __name__ == "__main__":
    main()
