#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A driver that puts many trainer ranks to sleep and wakes them, as a Ray
driver would, with dormant.client (see docs/orchestrators.md).

Local processes stand in for the Ray actors: each is examples/rl_loop.py
--role trainer (the simulated trainer unless torch and a GPU are there),
serving on a free port, and reports its URL on its first line of output, as
an actor method returning `dormant.serve().url` would. The driver then

  - puts every rank to sleep and wakes it, with the blocking Client, for
    --cycles rollout phases;
  - does one more cycle with the AsyncClient (an asyncio driver);
  - stops one rank and shows the RankError that names it.

  PYTHONPATH=python DORMANT_LIB=build/libdormant.so python3 examples/ray_driver.py --ranks 3
"""
import argparse
import asyncio
import pathlib
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
try:
    from dormant.client import AsyncClient, Client, RankError
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(HERE.parent / "python"))
    from dormant.client import AsyncClient, Client, RankError

MiB = 1 << 20


def start_actor():
    """One stand-in actor; returns (process, the URL it reports)."""
    p = subprocess.Popen([sys.executable, str(HERE / "rl_loop.py"), "--role", "trainer",
                          "--simulate", "--port", "0"],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("[trainer] serving "):
            return p, line.split()[-1]
    p.wait()
    raise RuntimeError(f"an actor exited ({p.returncode}) before serving")


def summary(verb, results):
    total = sum(r.bytes or 0 for r in results)
    slowest = max(r.seconds or 0 for r in results)
    return (f"{verb} {len(results)} ranks: {total / MiB:.1f} MiB, slowest rank "
            f"{slowest:.3f} s, states {sorted({r.state for r in results})}")


async def async_cycle(urls):
    async with AsyncClient(urls, concurrency=8) as ranks:
        print("[driver/asyncio]", summary("slept", await ranks.sleep()))
        print("[driver/asyncio]", summary("woke", await ranks.wake()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=2)
    args = ap.parse_args()

    actors = [start_actor() for _ in range(args.ranks)]
    urls = [url for _, url in actors]
    print(f"[driver] {len(urls)} ranks report {', '.join(urls)}")
    try:
        # The blocking client: every rank at once (at most 64 in flight),
        # a wake answered 503 retried after Retry-After, a token from
        # $DORMANT_TOKEN / $DORMANT_TOKEN_FILE when the ranks need one.
        ranks = Client(urls)
        for cycle in range(1, args.cycles + 1):
            print(f"[driver] cycle {cycle}:", summary("slept", ranks.sleep()))
            # ... the rollout engine would generate here, on the freed GPU ...
            print(f"[driver] cycle {cycle}:", summary("woke", ranks.wake()))
        print("[driver]", summary("stats of", ranks.stats()))

        asyncio.run(async_cycle(urls))

        # One rank goes away: the call still reaches the others, then
        # raises one RankError naming the rank that failed.
        gone, _ = actors[-1]
        gone.send_signal(signal.SIGINT)
        gone.wait(60)
        try:
            Client(urls, retries=1, backoff=0.05).sleep()
        except RankError as e:
            print(f"[driver] RankError: {e}")
            print(f"[driver] {len(e.failed)} failed, "
                  f"{sum(r.ok for r in e.results)} asleep: {[r.endpoint for r in e.failed]}")
        else:
            sys.exit("a stopped rank went unnoticed")
        Client(urls[:-1]).wake()
    finally:
        for p, _ in actors:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p, _ in actors:
            p.wait(60)
    print("[driver] done")


if __name__ == "__main__":
    main()
