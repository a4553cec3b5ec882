# SPDX-License-Identifier: MIT
"""The first bad input a new user makes and the fault switch of dormantd:
every program answers a bad flag with one line and exit status
2, -h/--help with its usage and 0, --version with the Meson project version;
dormantd checks its arguments before it starts a backend, and --fault (or
$DORMANT_FAULTS) makes device faults that HTTP clients see.

Run by meson (suite http) with the programs' paths in the environment."""
import http.client
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dormantd_process import Dormantd  # noqa: E402

PROGRAMS = {
    'dormantd': os.environ.get('DORMANTD', 'build/tools/dormantd'),
    'dormantctl': os.environ.get('DORMANTCTL', 'build/ctl/dormantctl'),
    'dormant-bench': os.environ.get('DORMANT_BENCH', 'build/bench/dormant-bench'),
    'probe-vmm': os.environ.get('PROBE_VMM', 'build/bench/probe-vmm'),
}
VERSION = os.environ.get('DORMANT_VERSION', '')
# only what a test passes may configure the programs
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith('DORMANT_') or k in ('DORMANT_BACKEND',)}
ENV['DORMANT_BACKEND'] = 'host'


def run(name, *args, env=None):
    return subprocess.run([PROGRAMS[name], *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**ENV, **(env or {})})


def one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert p.stdout == ''


@pytest.mark.parametrize('name', sorted(PROGRAMS))
@pytest.mark.parametrize('args, words', [
    (['-x'], ["unknown option '-x'"]),
    (['-q'], ["unknown option '-q'"]),
    (['--bogus'], ["unknown option '--bogus'"]),
    (['--bogus=1'], ["unknown option '--bogus=1'"]),
])
def test_unknown_flag_is_one_line_and_exit_2(name, args, words):
    one_line_error(run(name, *args), name, *words)


@pytest.mark.parametrize('name, flag', [
    ('dormantd', '--listen'), ('dormantd', '--keep'), ('dormantd', '--fault'),
    ('dormantctl', '--tags'), ('dormant-bench', '--keep'), ('probe-vmm', '--size'),
])
def test_missing_value_names_the_flag(name, flag):
    one_line_error(run(name, flag), name, f'option {flag} needs a value')


@pytest.mark.parametrize('name', sorted(PROGRAMS))
@pytest.mark.parametrize('flag', ['-h', '--help'])
def test_help_exits_0(name, flag):
    p = run(name, flag)
    assert p.returncode == 0, p.stderr
    assert 'usage' in p.stdout.lower() and '--version' in p.stdout
    assert p.stderr == ''


@pytest.mark.parametrize('name', sorted(PROGRAMS))
@pytest.mark.parametrize('flag', ['-V', '--version'])
def test_version(name, flag):
    p = run(name, flag)
    assert p.returncode == 0, p.stderr
    assert VERSION and p.stdout == f'{name} {VERSION}\n'


# ---- dormantd checks everything before the backend starts -------------------

@pytest.mark.parametrize('args, words', [
    (['--listen', 'nohost'], ['is not HOST:PORT']),
    (['--listen', '127.0.0.1:70000'], ['no port from 0 to 65535']),
    (['--listen', 'no-such-host.invalid:80'], ['cannot resolve']),
    (['--max-connections', '8', '--max-connections-per-ip', '9'], ['max_connections_per_ip']),
    (['--threads', '8', '--max-connections', '4'], ['at least threads']),
    (['--request-timeout', '0'], ['--request-timeout must be from 1']),
    (['--connection-timeout', 'x'], ['--connection-timeout must be from 1']),
    (['--max-connections', '70000'], ['--max-connections must be from 1 to 65536']),
    (['--fault', 'wake:bogus'], ['fault rule']),
    (['--fault', 'wake:create,sleep:copy'], ['--fault takes one rule']),
    (['--fault', 'wake:create', '--fault', 'wake:create'], ['two fault rules']),
    (['--token-file', '/nonexistent/token'], ['/nonexistent/token']),
    (['--backend', 'tpu'], ['--backend must be']),
    (['--keep', '12XB'], ['is not a size']),
    (['--option', 'chunk_size=1GiB'], ['--option', "unknown option 'chunk_size'"]),
    (['--option', 'copy_threads=999'], ['--option', 'copy_threads', '999']),
    (['--option', 'host_mode'], ['--option', 'not name=value']),
    (['--server-option', 'treads=2'], ['--server-option', "unknown server option 'treads'"]),
    (['--server-option', 'threads=999'], ['--server-option', 'threads', '999']),
    (['--server-option', 'threads=2,quiet=maybe'], ['--server-option', 'quiet', 'maybe']),
    # applied after the flags, and checked with them before the backend starts
    (['--server-option', 'token_file=/nonexistent/t2'], ['/nonexistent/t2']),
    (['--max-connections', '4', '--server-option', 'threads=8'], ['at least threads']),
])
def test_dormantd_checks_arguments_before_the_backend(args, words):
    # not --quiet: the backend would say it started
    p = run('dormantd', '--backend', 'host', *args)
    one_line_error(p, 'dormantd:', *words)
    assert 'backend,' not in p.stderr


def test_dormantd_sizes_must_fit_the_device():
    p = run('dormantd', '--backend', 'host', '--quiet', '--keep', '48MiB', '--discard', '48MiB',
            '--listen', '127.0.0.1:0', env={'DORMANT_HOST_DEVICE_BYTES': '64MiB'})
    one_line_error(p, '--keep 48MiB and --discard 48MiB do not fit in device 0',
                   '(64 MiB of 64 MiB free)')


def test_dormantd_keep_larger_than_the_device_fails_at_once():
    # the host backend's default device: 64 GiB; nothing is allocated first
    p = run('dormantd', '--backend', 'host', '--quiet', '--keep', '1TiB',
            '--listen', '127.0.0.1:0')
    one_line_error(p, '--keep 1TiB and --discard 64MiB do not fit in device 0',
                   '(64 GiB of 64 GiB free)')


def test_dormantd_keep_larger_than_host_memory_fails_at_once():
    """Kept bytes need their host copy (and, on the host backend, the device
    is host memory too): more than the machine has is refused before
    anything is allocated or filled."""
    with open('/proc/meminfo') as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith('MemTotal:'))
    keep_gib = total_kib // (1 << 20) + 1  # more than all of it, but within the device
    p = run('dormantd', '--backend', 'host', '--quiet', '--keep', f'{keep_gib}GiB',
            '--listen', '127.0.0.1:0', env={'DORMANT_HOST_DEVICE_BYTES': f'{4 * keep_gib}GiB'})
    one_line_error(p, f'--keep {keep_gib}GiB and --discard 64MiB need', 'of host memory',
                   'available')


def test_dormantd_options_apply_and_are_listed():
    # the device size through --option, as through the environment above
    p = run('dormantd', '--backend', 'host', '--quiet', '--keep', '48MiB', '--discard', '48MiB',
            '--listen', '127.0.0.1:0', '--option', 'host_device_bytes=64MiB')
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert 'do not fit in device 0' in p.stderr, p.stderr
    # --help lists the library's options with their variables
    p = run('dormantd', '--help')
    for word in ('--option NAME=VALUE', 'chunk_bytes', '$DORMANT_CHUNK_BYTES', 'pin_host',
                 'auto|cuda|host'):
        assert word in p.stdout, word
    # and the server's, from server/server_options.c
    for word in ('--server-option NAME=VALUE', 'request_timeout_s', 'int, default 10',
                 '$DORMANT_TOKEN_FILE', '$DORMANT_PUBLISH', 'max_connections_per_ip'):
        assert word in p.stdout, word


def test_rules_that_would_never_fire_are_refused():
    for rule, fires in (('sleep:create', 'wake'), ('sleep:map', 'wake'),
                        ('wake:host-alloc', 'sleep')):
        p = run('dormantd', '--backend', 'host', '--quiet', '--fault', rule)
        one_line_error(p, f'fault rule {rule} would never fire', f'fires at {fires}')


def test_no_token_beyond_loopback_is_refused_unless_insecure_no_auth(tmp_path):
    p = run('dormantd', '--backend', 'host', '--quiet', '--listen', '0.0.0.0:0')
    one_line_error(p, 'refusing to listen on 0.0.0.0:0 without a token',
                   'insecure_no_auth (--insecure-no-auth)')
    p = run('dormantd', '--backend', 'host', '--quiet', '--listen', '0.0.0.0:0',
            '--token', 'REPLACE-ME-openssl-rand-hex-32')
    one_line_error(p, 'placeholder')
    # said explicitly: it starts, and says so on stderr even when quiet
    for extra, env in ((['--insecure-no-auth'], {}), ([], {'DORMANT_INSECURE_NO_AUTH': '1'}),
                       (['--token', 's3cret'], {})):
        d = Dormantd(PROGRAMS['dormantd'], tmp_path, 'open', '--listen', '0.0.0.0:0', *extra,
                     env=env)
        try:
            assert get(d, '/healthz')[0] in (200, 401)
            warned = 'warning: no authentication on http://0.0.0.0:' in d.output()
            assert warned == ('--token' not in extra), d.output()
        finally:
            assert d.stop() == 0, d.output()


# ---- the fault switch over HTTP ---------------------------------------------

def post(d, path):
    c = http.client.HTTPConnection('127.0.0.1', d.port, timeout=30)
    try:
        c.request('POST', path, body=b'', headers={'Content-Length': '0'})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b'null')
    finally:
        c.close()


def get(d, path):
    c = http.client.HTTPConnection('127.0.0.1', d.port, timeout=30)
    try:
        c.request('GET', path)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b'null')
    finally:
        c.close()


def test_fault_flag_rehearses_a_failed_wake(tmp_path):
    d = Dormantd(PROGRAMS['dormantd'], tmp_path, 'fault', '--fault', 'wake:create',
                 env={'DORMANT_FAULTS': ''})
    try:
        assert post(d, '/sleep')[0] == 200
        status, body = post(d, '/wake')
        assert status == 503 and body['type'].endswith('out-of-memory'), body
        # counted as the rule counts: the wake's first create call (not the
        # process's third, after the trainer's two allocations)
        assert 'injected fault: create call 1 failed' in body['detail'], body
        status, body = get(d, '/stats')
        assert body['state'] == 'asleep'
        assert post(d, '/wake')[0] == 200
        # the simulated trainer checks the weights after every wake
        for _ in range(400):
            extra = get(d, '/stats')[1]['extra']
            if extra['verifications'] >= 1:
                break
            time.sleep(0.025)
        assert extra['verifications'] >= 1 and extra['mismatches'] == 0, extra
    finally:
        assert d.stop() == 0, d.output()


def test_fault_environment_arms_nothing_and_the_flag_is_never_hidden(tmp_path):
    d = Dormantd(PROGRAMS['dormantd'], tmp_path, 'envfault',
                 env={'DORMANT_FAULTS': 'sleep:copy:1:EIO:2'})
    try:
        assert post(d, '/sleep')[0] == 200
        assert post(d, '/wake')[0] == 200
        assert get(d, '/stats')[1]['faults'] == {'armed': False, 'rules': None}
        assert '$DORMANT_FAULTS is ignored' in d.output(), d.output()
    finally:
        assert d.stop() == 0, d.output()
    d = Dormantd(PROGRAMS['dormantd'], tmp_path, 'flagfault', '--fault', 'sleep:copy:1:EIO:2')
    try:
        # logged at start, quiet or not; shown in /stats and /metrics
        assert 'fault injection armed (a test tool): sleep:copy:1:EIO:2' in d.output()
        assert get(d, '/stats')[1]['faults'] == {'armed': True, 'rules': 'sleep:copy:1:EIO:2'}
        c = http.client.HTTPConnection('127.0.0.1', d.port, timeout=30)
        c.request('GET', '/metrics')
        assert '\ndormant_faults_armed 1\n' in c.getresponse().read().decode()
        c.close()
        for _ in range(2):
            status, body = post(d, '/sleep')
            assert status == 500 and body['type'].endswith('device-error'), body
            assert get(d, '/stats')[1]['state'] == 'awake'
        assert post(d, '/sleep')[0] == 200
        assert post(d, '/wake')[0] == 200
    finally:
        assert d.stop() == 0, d.output()
