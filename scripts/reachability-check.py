#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Abusive clients against a running dormantd on loopback, with
the answers of /healthz (1 s timeout) and a sleep and a wake after each:
192 partial requests closed with a FIN in the same segment, 64 clients
trickling a header line every 10 s for 35 s, 500 idle keep-alive
connections. Prints what it saw; asserts nothing (the tests in
tests/http/test_abuse.c do).

    build/tools/dormantd --backend host --listen 127.0.0.1:0 --port-file /tmp/p --quiet &
    ulimit -n 4096; scripts/reachability-check.py $(cat /tmp/p)
"""
import socket, sys, time, http.client, threading
port = int(sys.argv[1])
def req(method, path, timeout=5.0):
    t=time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request(method, path, body=b"" if method=="POST" else None); r = c.getresponse(); r.read(); c.close()
        return r.status, time.monotonic()-t
    except Exception as e:
        return repr(e)[:40], time.monotonic()-t
def probe_loop(label, seconds):
    worst=0; bad=0; n=0; end=time.monotonic()+seconds
    while time.monotonic()<end:
        st,dt=req("GET","/healthz",1.0); n+=1; worst=max(worst,dt); bad+= st!=200
        time.sleep(0.2)
    s1=req("POST","/sleep"); w1=req("POST","/wake")
    print(f"{label}: {n} probes, {bad} failed, worst {worst*1e3:.1f} ms; sleep {s1[0]} wake {w1[0]}", flush=True)
# 1: 3 x 64 partial+FIN together
for b in range(3):
    for i in range(64):
        s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: a"); s.shutdown(socket.SHUT_WR); s.close()
probe_loop("192 partial+FIN", 3)
# 2: 64 trickling one header line every 10 s, for 35 s
socks=[]
for i in range(64):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"GET /healthz HTTP/1.1\r\n"); socks.append(s)
def trickle():
    for k in range(4):
        time.sleep(10 if k else 0)
        for s in socks:
            try: s.sendall(b"X-Slow-%d: y\r\n" % k)
            except OSError: pass
t=threading.Thread(target=trickle); t.start()
probe_loop("64 trickling clients (35 s)", 35); t.join()
closed=0
for s in socks:
    s.settimeout(0.1)
    try: closed += s.recv(10)==b""
    except ConnectionResetError: closed+=1
    except socket.timeout: pass
print(f"  trickling connections closed by the server: {closed}/64")
# 3: 500 idle keep-alive
keep=[]
for i in range(500):
    c=http.client.HTTPConnection("127.0.0.1", port, timeout=5); c.request("GET","/healthz"); c.getresponse().read(); keep.append(c)
probe_loop("500 idle keep-alive connections", 3)
