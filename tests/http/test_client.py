# SPDX-License-Identifier: MIT
"""dormant.client against several real dormantd processes
on loopback: all up, one down, one answering 503 then recovering, a wrong
token, one that never answers (past the timeout); the blocking Client and
the AsyncClient alike. Also the endpoint forms, the token sources, the
concurrency limit and the retry delays.

Run by meson (suite http) with $DORMANTD and the python/ directory on
PYTHONPATH."""
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dormantd_process import Dormantd  # noqa: E402

import dormant  # noqa: E402
from dormant import client as dc  # noqa: E402
from dormant.client import AsyncClient, Client, RankError  # noqa: E402

DORMANTD = os.environ.get('DORMANTD', 'build/tools/dormantd')
TAG = 4 << 20  # bytes of each of dormantd's two tags
FAST = dict(backoff=0.01, max_delay=0.05)  # retries without real waits


@pytest.fixture(autouse=True)
def no_token_env(monkeypatch):
    monkeypatch.delenv('DORMANT_TOKEN', raising=False)
    monkeypatch.delenv('DORMANT_TOKEN_FILE', raising=False)


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(name, *extra, **kw):
        d = Dormantd(DORMANTD, tmp_path, name, *extra, keep='4MiB', discard='4MiB', **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture(params=['blocking', 'asyncio'])
def call(request):
    """call(endpoints, action, *args, **client_options): run one client call
    with the blocking Client or the AsyncClient."""
    def run(endpoints, action, *args, waits=None, **options):
        if request.param == 'blocking':
            c = Client(endpoints, **options)
            if waits is not None:
                c._sleep = waits.append
            return getattr(c, action)(*args)
        c = AsyncClient(endpoints, **options)
        if waits is not None:
            async def record(s):
                waits.append(s)
            c._async_sleep = record
        return asyncio.run(getattr(c, action)(*args))
    return run


class Silent:
    """A TCP server that accepts and reads but never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- all up ----------------------------------------------------------------

def test_all_up_sleep_wake_stats_health(servers, call):
    a, b, u = servers('a'), servers('b'), servers('u', unix=True)
    eps = [a.endpoint, b.url, u.unix_path]
    names = [a.endpoint, a.endpoint.replace(str(a.port), str(b.port)), f'unix:{u.unix_path}']

    slept = call(eps, 'sleep')
    assert [r.endpoint for r in slept] == names
    for r in slept:
        assert r.ok and r.status == 200 and r.state == 'asleep' and r.changed
        assert r.bytes == 2 * TAG and r.seconds is not None and r.attempts == 1
    stats = call(eps, 'stats')
    assert all(r.ok and r.state == 'asleep' and r.bytes == 0 and r.host_bytes == TAG
               for r in stats)
    woken = call(eps, 'wake', ['weights'])
    assert all(r.ok and r.state == 'mixed' and r.bytes == TAG for r in woken)
    woken = call(eps, 'wake')
    assert all(r.ok and r.state == 'awake' and r.bytes == TAG for r in woken)
    again = call(eps, 'wake')
    assert all(r.ok and r.changed is False for r in again)
    health = call(eps, 'health')
    assert all(r.ok and r.state == 'ok' for r in health)
    ready = call(eps, 'ready')
    assert all(r.ok and r.state == 'ready' for r in ready), ready


def test_tags_are_sent(servers, call):
    a = servers('a')
    r, = call([a.endpoint], 'sleep', ['grads'])
    assert r.ok and r.state == 'mixed' and r.bytes == TAG
    with pytest.raises(RankError) as e:
        call([a.endpoint], 'sleep', ['nosuch'])
    assert e.value.failed[0].status == 404
    assert e.value.failed[0].problem['status'] == 404


# ---- one down --------------------------------------------------------------

def test_one_down_is_named_and_the_others_succeed(servers, call):
    a, b = servers('a'), servers('b')
    down = f'127.0.0.1:{free_port()}'
    with pytest.raises(RankError) as e:
        call([a.endpoint, down, b.endpoint], 'sleep', retries=2, **FAST)
    err = e.value
    assert isinstance(err, dormant.DormantError)
    assert [r.endpoint for r in err.results] == [a.endpoint, down, b.endpoint]
    assert [r.endpoint for r in err.failed] == [down]
    bad = err.failed[0]
    assert bad.status is None and 'cannot connect' in bad.error and bad.attempts == 3
    assert down in str(err) and a.endpoint not in str(err)
    assert err.results[0].ok and err.results[0].state == 'asleep'
    assert err.results[2].ok and err.results[2].state == 'asleep'


def test_results_without_raising(servers, call):
    a = servers('a')
    down = f'127.0.0.1:{free_port()}'
    results = call([a.endpoint, down], 'health', retries=0, raise_on_error=False)
    assert [r.ok for r in results] == [True, False]


def test_a_server_that_comes_up_during_the_retries_is_reached(servers):
    port = free_port()
    waits = []
    started = []

    def start_on_first_wait(s):
        waits.append(s)
        if not started:
            started.append(servers('late', '--listen', f'127.0.0.1:{port}'))

    c = Client([f'127.0.0.1:{port}'], retries=3, **FAST)
    c._sleep = start_on_first_wait
    r, = c.health()
    assert r.ok and r.attempts == 2 and len(waits) == 1


# ---- 503 then recovering ---------------------------------------------------

def test_503_is_retried_until_the_wake_succeeds(servers, call):
    a, flaky = servers('a'), servers('flaky', '--fail-wakes', '1')
    call([a.endpoint, flaky.endpoint], 'sleep')
    woken = call([a.endpoint, flaky.endpoint], 'wake', retries=2, **FAST)
    assert [r.attempts for r in woken] == [1, 2]
    assert all(r.ok and r.state == 'awake' for r in woken)


def test_503_honours_retry_after(servers, call):
    flaky = servers('flaky', '--fault', 'wake:create:1:ENOMEM:2')
    call([flaky.endpoint], 'sleep')
    waits = []
    r, = call([flaky.endpoint], 'wake', retries=3, backoff=0.01, max_delay=60, waits=waits)
    assert r.ok and r.attempts == 3
    # dormantd sends Retry-After: 5; the client waits that, plus up to 20%
    assert len(waits) == 2 and all(5 <= w <= 6 for w in waits)


def test_503_past_the_retries_carries_the_problem(servers, call):
    flaky = servers('flaky', '--fail-wakes', '3')
    call([flaky.endpoint], 'sleep')
    with pytest.raises(RankError) as e:
        call([flaky.endpoint], 'wake', retries=1, **FAST)
    bad, = e.value.failed
    assert bad.status == 503 and bad.attempts == 2 and bad.state == 'asleep'
    assert bad.problem['type'] == 'urn:dormant:problem:out-of-memory'
    assert 'out-of-memory' in bad.error and 'after 2 attempts' in bad.error


# ---- tokens ----------------------------------------------------------------

def test_wrong_token_fails_at_once(servers, call):
    a, t = servers('a'), servers('t', '--token', 'right-token')
    with pytest.raises(RankError) as e:
        call([a.endpoint, t.endpoint], 'stats', token='wrong-token', retries=3, **FAST)
    bad, = e.value.failed
    assert bad.endpoint == t.endpoint and bad.status == 401 and bad.attempts == 1
    assert bad.problem['type'] == 'urn:dormant:problem:unauthorized'
    r, = call([t.endpoint], 'stats', token='right-token')
    assert r.ok


def test_token_from_the_environment_and_a_file(servers, call, monkeypatch, tmp_path):
    t = servers('t', '--token', 'env-token')
    monkeypatch.setenv('DORMANT_TOKEN', 'env-token')
    assert call([t.endpoint], 'stats')[0].ok
    monkeypatch.delenv('DORMANT_TOKEN')
    f = tmp_path / 'token'
    f.write_text('env-token\n')
    monkeypatch.setenv('DORMANT_TOKEN_FILE', str(f))
    assert call([t.endpoint], 'stats')[0].ok
    monkeypatch.delenv('DORMANT_TOKEN_FILE')
    assert call([t.endpoint], 'stats', token_file=str(f))[0].ok
    with pytest.raises(RankError):
        call([t.endpoint], 'stats')
    monkeypatch.setenv('DORMANT_TOKEN', 'env-token')
    with pytest.raises(RankError) as e:
        call([t.endpoint], 'stats', token=False)  # none sent, whatever the environment says
    assert e.value.failed[0].status == 401


@pytest.mark.parametrize('token', ['', 'has space', 'x' * 4097, 'caf\u00e9'])
def test_bad_tokens_are_refused(token):
    with pytest.raises(ValueError):
        Client('127.0.0.1:1', token=token)


# ---- slow ------------------------------------------------------------------

def test_a_slow_server_times_out_and_the_others_succeed(servers, call):
    # it would answer, but only after 3 s: well past the 0.3 s timeout
    a, slow = servers('a'), Counting(1, 3.0)
    try:
        with pytest.raises(RankError) as e:
            call([a.endpoint, slow.endpoints[0]], 'health', timeout=0.3, retries=1, **FAST)
    finally:
        slow.close()
    bad, = e.value.failed
    assert bad.endpoint == slow.endpoints[0] and 'timed out' in bad.error
    assert bad.attempts == 2 and bad.status is None
    assert e.value.results[0].ok


def test_a_silent_server_times_out(call):
    silent = Silent()
    try:
        with pytest.raises(RankError) as e:
            call([f'127.0.0.1:{silent.port}'], 'sleep', timeout=0.2, retries=0)
    finally:
        silent.close()
    assert 'timed out' in e.value.failed[0].error


def test_every_failed_rank_is_named(call):
    downs = [f'127.0.0.1:{free_port()}', f'127.0.0.1:{free_port()}']
    with pytest.raises(RankError) as e:
        call(downs, 'stats', retries=0)
    assert [r.endpoint for r in e.value.failed] == downs
    assert all(d in str(e.value) for d in downs) and '2 of 2 ranks' in str(e.value)


# ---- concurrency -----------------------------------------------------------

class Counting:
    """Tiny HTTP servers that answer /healthz after a pause and record the
    most requests all of them held at once."""

    def __init__(self, servers, pause_s):
        self.pause_s = pause_s
        self.now = self.most = 0
        self.lock = threading.Lock()
        self.socks = []
        for _ in range(servers):
            s = socket.socket()
            s.bind(('127.0.0.1', 0))
            s.listen(16)
            self.socks.append(s)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        self.endpoints = [f'127.0.0.1:{s.getsockname()[1]}' for s in self.socks]

    def _accept(self, sock):
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _release(self):
        with self.lock:
            self.now -= 1

    def _serve(self, c):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        held = True
        try:
            c.recv(4096)
            time.sleep(self.pause_s)
            body = b'{"status":"ok"}'
            # No longer held once answered: released before the answer goes
            # out, or a client that sends its next request as soon as it
            # reads this one would find it still counted.
            held = False
            self._release()
            c.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                      b'Content-Length: %d\r\nConnection: close\r\n\r\n%s' % (len(body), body))
        except OSError:
            pass  # the client gave up first
        finally:
            if held:
                self._release()
            c.close()

    def close(self):
        for s in self.socks:
            s.close()


@pytest.mark.parametrize('limit', [1, 3])
def test_concurrency_limit(call, limit):
    srv = Counting(6, 0.2)
    try:
        results = call(srv.endpoints, 'health', concurrency=limit)
    finally:
        srv.close()
    assert len(results) == 6 and all(r.ok and r.state == 'ok' for r in results)
    assert 1 <= srv.most <= limit


# ---- answers dormantd never gives ------------------------------------------

class Scripted:
    """A TCP server whose n-th connection gets the n-th (pause_s, status,
    body) of a script (the last one again when the script runs out)."""

    def __init__(self, script):
        self.script = list(script)
        self.count = 0
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(16)
        self.endpoint = f'127.0.0.1:{self.sock.getsockname()[1]}'
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            pause, status, body = self.script[min(self.count, len(self.script) - 1)]
            self.count += 1
            threading.Thread(target=self._serve, args=(c, pause, status, body),
                             daemon=True).start()

    @staticmethod
    def _serve(c, pause, status, body):
        try:
            c.recv(65536)
            time.sleep(pause)
            c.sendall(b'HTTP/1.1 %d X\r\nContent-Type: application/json\r\n'
                      b'Content-Length: %d\r\nConnection: close\r\n\r\n%s'
                      % (status, len(body), body))
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.sock.close()


REPORT = b'{"state":"asleep","changed":false,"duration_s":0.0,"bytes_released":0}'
BUSY = b'{"type":"urn:dormant:problem:busy","title":"Busy","status":409,"detail":"busy"}'


def test_409_after_a_timed_out_attempt_is_retried(call):
    # the first attempt times out once sent; the rank is still running that
    # sleep (409), then reports it
    srv = Scripted([(1.0, 200, REPORT), (0, 409, BUSY), (0, 200, REPORT)])
    try:
        r, = call([srv.endpoint], 'sleep', timeout=0.3, retries=3, **FAST)
    finally:
        srv.close()
    assert r.ok and r.attempts == 3 and r.state == 'asleep'


def test_409_alone_is_not_retried(call):
    srv = Scripted([(0, 409, BUSY), (0, 200, REPORT)])
    try:
        with pytest.raises(RankError) as e:
            call([srv.endpoint], 'sleep', retries=3, **FAST)
    finally:
        srv.close()
    bad, = e.value.failed
    assert bad.status == 409 and bad.attempts == 1 and 'busy' in bad.error


def test_an_oversized_answer_fails_without_retries(call, monkeypatch):
    monkeypatch.setattr(dc, '_RESPONSE_MAX', 1000)
    srv = Scripted([(0, 200, b'{"status":"' + b'x' * 2000 + b'"}')])
    try:
        with pytest.raises(RankError) as e:
            call([srv.endpoint], 'health', retries=3, **FAST)
    finally:
        srv.close()
    bad, = e.value.failed
    assert 'longer than 1000 bytes' in bad.error and bad.attempts == 1


def test_a_200_that_is_not_json_fails(call):
    srv = Scripted([(0, 200, b'not json')])
    try:
        with pytest.raises(RankError) as e:
            call([srv.endpoint], 'stats', retries=0)
    finally:
        srv.close()
    assert 'not a JSON object' in e.value.failed[0].error


# ---- endpoints and options -----------------------------------------------------

def test_endpoint_forms():
    names = [e.name for e in dc.parse_endpoints(
        ['h1', 'h2:9000', 'http://h3:1', 'https://h4:2', '[::1]:3', '::1', 'unix:/run/x.sock',
         '/run/y.sock', 'h2:9000'], ports='8787-8788')]
    assert names == ['h1:8787', 'h1:8788', 'h2:9000', 'h3:1', 'https://h4:2', '[::1]:3',
                     '[::1]:8787', '[::1]:8788', 'unix:/run/x.sock', 'unix:/run/y.sock']
    assert [e.name for e in dc.parse_endpoints('h')] == ['h:8787']


def test_dns_form_takes_every_address_on_each_port():
    names = [e.name for e in dc.parse_endpoints(dns='localhost', ports=[1, 2],
                                                family=socket.AF_INET)]
    assert names == ['127.0.0.1:1', '127.0.0.1:2']


@pytest.mark.parametrize('spec', ['', 'ftp://h', 'h:0', 'h:65536', 'h:x', 'http://h/path',
                                  'u@h', '[zz]:1', '-h', 'unix:', 'h\n'])
def test_bad_endpoints_are_refused(spec):
    with pytest.raises(ValueError):
        dc.parse_endpoints([spec])


@pytest.mark.parametrize('options', [dict(concurrency=0), dict(retries=-1), dict(timeout=0),
                                     dict(backoff=-1), dict(ports='9-1'), dict(ports='1,1')])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        Client('h', **options)


def test_retry_delays_double_jitter_and_cap():
    c = Client('h', backoff=1, max_delay=5)
    for _ in range(50):
        assert 0.5 <= c.delay_s(1, -1) <= 1
        assert 2 <= c.delay_s(3, -1) <= 4
        assert c.delay_s(9, -1) <= 5
        assert 3 <= c.delay_s(1, 3) <= 3.6
        assert c.delay_s(1, 100) == 5


def test_importing_the_client_does_not_load_libdormant(tmp_path):
    code = ('import dormant.client, sys\n'
            'maps = open("/proc/self/maps").read()\n'
            'sys.exit(1 if "libdormant" in maps else 0)\n')
    env = dict(os.environ, DORMANT_LIB=str(tmp_path / 'nothing.so'))
    env.pop('LD_LIBRARY_PATH', None)
    p = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
