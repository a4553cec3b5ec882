#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A flood of HTTP clients against one dormant server, with a prober.

CLIENTS threads each send GET PATH as fast as answers come, on a new
connection per request (like urllib) or, with --keep-alive, on one kept
connection (reopened when the server closes it). Meanwhile a prober opens a
new connection every --probe-interval seconds and sends GET /healthz, as a
kubelet does. Counted:

  probes failed         a probe not answered 200 within --probe-timeout
  closed unanswered     a request sent whose connection ended (closed, reset,
                        timed out) before any byte of an answer; on a kept
                        connection (the client could retry it) and on a fresh
                        one, apart
  connect failed        connect() refused or reset
  answers by status     200, 503 (over the limits: Retry-After), ...

Only the standard library. Usage:
  bench/flood.py --url http://127.0.0.1:PORT [--clients 50] [--seconds 20]
  bench/flood.py --port-file FILE ...
  --keep-alive: kept connections; --obey-retry-after: clients that back off
Prints one line of JSON last. Exits 1 if a probe failed or a request was
closed unanswered, else 0.
"""
import argparse
import json
import socket
import sys
import threading
import time
import urllib.parse


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}
        self.unanswered_fresh = 0
        self.unanswered_kept = 0
        self.connect_failed = 0
        self.probes = 0
        self.probes_failed = 0
        self.probe_failures = []
        self.probe_worst_s = 0.0

    def add(self, name, n=1):
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def answer(self, status):
        with self.lock:
            self.status[status] = self.status.get(status, 0) + 1


def read_answer(sock):
    """One HTTP/1.1 answer: (status, close, retry_after_s). Raises EOFError
    when the connection ends before any byte of it, ConnectionError (an
    OSError) after some."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            if buf:
                raise ConnectionError("closed within an answer's head")
            raise EOFError()
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed within an answer's body")
        body += chunk
    retry = headers.get("retry-after", "")
    return (status, headers.get("connection", "").lower() == "close",
            float(retry) if retry.isdigit() else 0.0)


def connect(target, timeout):
    if target[0] == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(target[1])
    else:
        s = socket.create_connection(target[1:], timeout=timeout)
    return s


def client(target, path, headers, deadline, keep_alive, obey, timeout, counts):
    request = (f"GET {path} HTTP/1.1\r\nHost: dormant\r\n{headers}\r\n").encode()
    sock = None
    reused = False
    while time.monotonic() < deadline:
        if sock is None:
            try:
                sock = connect(target, timeout)
            except OSError:
                counts.add("connect_failed")
                time.sleep(0.01)
                continue
            reused = False
        try:
            sock.sendall(request)
            status, close, retry_after_s = read_answer(sock)
        except (EOFError, OSError, ValueError):
            # OSError: reset, timed out, or closed within an answer
            counts.add("unanswered_kept" if reused else "unanswered_fresh")
            sock.close()
            sock = None
            continue
        counts.answer(status)
        if close or not keep_alive:
            sock.close()
            sock = None
        else:
            reused = True
        if obey and retry_after_s:
            time.sleep(min(retry_after_s, max(0.0, deadline - time.monotonic())))
    if sock is not None:
        sock.close()


def prober(target, headers, deadline, interval, timeout, counts):
    request = (f"GET /healthz HTTP/1.1\r\nHost: dormant\r\n{headers}"
               "Connection: close\r\n\r\n").encode()
    while time.monotonic() < deadline:
        start = time.monotonic()
        why = None
        try:
            with connect(target, timeout) as s:
                s.sendall(request)
                status, _, _ = read_answer(s)
                if status != 200:
                    why = f"status {status}"
        except EOFError:
            why = "closed unanswered"
        except (OSError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
        took = time.monotonic() - start
        with counts.lock:
            counts.probes += 1
            counts.probe_worst_s = max(counts.probe_worst_s, took)
            if why:
                counts.probes_failed += 1
                if len(counts.probe_failures) < 10:
                    counts.probe_failures.append(why)
        time.sleep(max(0.0, interval - took))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="http://HOST:PORT or unix:PATH")
    where.add_argument("--port-file", help="a port file (127.0.0.1)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--path", default="/stats", help="what the flood asks (default /stats)")
    ap.add_argument("--keep-alive", action="store_true",
                    help="one kept connection per client, not one per request")
    ap.add_argument("--obey-retry-after", action="store_true",
                    help="wait as a 503's Retry-After says (else retry at once, as a "
                         "hostile flood does)")
    ap.add_argument("--probe-interval", type=float, default=0.1)
    ap.add_argument("--probe-timeout", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds a flood request may wait for its answer")
    ap.add_argument("--token-file", help="send Authorization: Bearer with this token")
    args = ap.parse_args()

    if args.port_file:
        with open(args.port_file) as f:
            target = ("tcp", "127.0.0.1", int(f.read().strip()))
    elif args.url.startswith("unix:"):
        target = ("unix", args.url[5:])
    else:
        u = urllib.parse.urlsplit(args.url)
        target = ("tcp", u.hostname, u.port or 80)
    headers = ""
    if args.token_file:
        with open(args.token_file) as f:
            headers = f"Authorization: Bearer {f.read().strip()}\r\n"

    counts = Counts()
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=client, daemon=True,
                                args=(target, args.path, headers, deadline, args.keep_alive,
                                      args.obey_retry_after, args.timeout, counts))
               for _ in range(args.clients)]
    threads.append(threading.Thread(target=prober, daemon=True,
                                    args=(target, headers, deadline, args.probe_interval,
                                          args.probe_timeout, counts)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    answered = sum(counts.status.values())
    result = {
        "clients": args.clients,
        "seconds": args.seconds,
        "keep_alive": args.keep_alive,
        "obey_retry_after": args.obey_retry_after,
        "path": args.path,
        "requests_answered": answered,
        "answers_by_status": {str(k): v for k, v in sorted(counts.status.items())},
        "closed_unanswered": counts.unanswered_fresh + counts.unanswered_kept,
        "closed_unanswered_fresh": counts.unanswered_fresh,
        "closed_unanswered_kept_alive": counts.unanswered_kept,
        "connect_failed": counts.connect_failed,
        "probes": counts.probes,
        "probes_failed": counts.probes_failed,
        "probe_failures": counts.probe_failures,
        "probe_worst_s": round(counts.probe_worst_s, 3),
    }
    print(f"{args.clients} clients, {args.seconds:g} s, "
          f"{'kept-alive' if args.keep_alive else 'a connection per request'}: "
          f"{answered} answered {result['answers_by_status']}, "
          f"{result['closed_unanswered']} closed unanswered "
          f"({counts.unanswered_kept} on kept connections), "
          f"{counts.connect_failed} connects failed; "
          f"{counts.probes_failed} of {counts.probes} probes failed "
          f"(slowest {result['probe_worst_s']} s)", file=sys.stderr)
    print(json.dumps(result))
    return 1 if counts.probes_failed or result["closed_unanswered"] else 0


if __name__ == "__main__":
    sys.exit(main())
