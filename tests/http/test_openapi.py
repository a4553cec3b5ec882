# SPDX-License-Identifier: MIT
"""openapi.yaml stays true: start a real dormantd, call every route, and check
each answer (status, content type, headers, body) against the spec.

Run by meson (suite http) with DORMANTD and OPENAPI set:
    DORMANTD=build/tools/dormantd OPENAPI=openapi.yaml python3 -m pytest tests/http/test_openapi.py
"""
import http.client
import json
import os
import sys
import tempfile
import time

import jsonschema
import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dormantd_process import Dormantd  # noqa: E402

DORMANTD = os.environ.get('DORMANTD', 'build/tools/dormantd')
OPENAPI = os.environ.get('OPENAPI', 'openapi.yaml')
TOKEN = 'openapi-test-token'

with open(OPENAPI, 'rb') as f:
    SPEC_BYTES = f.read()
SPEC = yaml.safe_load(SPEC_BYTES)

# (path, method, status) answered and checked, for the coverage test at the end
CHECKED = set()


# ---- the spec as JSON Schema ------------------------------------------------

def resolve(node):
    """Inline $refs and turn OpenAPI 3.0's `nullable` into JSON Schema."""
    if isinstance(node, list):
        return [resolve(n) for n in node]
    if not isinstance(node, dict):
        return node
    if '$ref' in node:
        target = SPEC
        for part in node['$ref'].lstrip('#/').split('/'):
            target = target[part]
        return resolve(target)
    out = {k: resolve(v) for k, v in node.items() if k not in ('example', 'nullable')}
    if node.get('nullable'):
        if 'type' in out:
            out['type'] = [out['type'], 'null']
        if 'enum' in out:
            out['enum'] = list(out['enum']) + [None]
    return out


def operation(path, method):
    ops = SPEC['paths'].get(path)
    assert ops is not None, 'path %s is not in openapi.yaml' % path
    op = ops.get(method.lower())
    assert op is not None, '%s %s is not in openapi.yaml' % (method, path)
    return op


def media_type(value):
    return value.split(';')[0].strip().lower() if value else ''


def check(response, path, method, body):
    """Check one answer against the spec; returns the parsed JSON (or text)."""
    status = str(response.status)
    content_type = response.getheader('Content-Type')
    if path in SPEC['paths'] and method.lower() not in SPEC['paths'][path]:
        # a method the path does not take: 405 (401 first when a token is required)
        assert status in ('405', '401'), (method, path, status, body)
        spec = resolve(SPEC['components']['responses'][
            'MethodNotAllowed' if status == '405' else 'Unauthorized'])
    elif path in SPEC['paths']:
        op = operation(path, method)
        assert status in op['responses'], \
            '%s %s answered %s, which openapi.yaml does not list: %s' % (method, path, status, body)
        spec = resolve(op['responses'][status])
    else:
        # an unknown path: 404 not-found, or 401 when a token is required
        assert status in ('404', '401'), (path, status, body)
        spec = resolve(SPEC['components']['responses']['BadRequest'])
    CHECKED.add((path, method.upper(), status))

    for name in spec.get('headers', {}):
        assert response.getheader(name) is not None, \
            '%s %s %s lacks the %s header' % (method, path, status, name)
    content = spec.get('content', {})
    declared = {media_type(k): (k, v) for k, v in content.items()}
    assert media_type(content_type) in declared, \
        '%s %s %s: Content-Type %s, spec says %s' % (method, path, status, content_type,
                                                    list(content))
    full, media = declared[media_type(content_type)]
    if ';' in full:  # the spec names the parameters too (metrics): exact
        assert content_type == full, (content_type, full)
    if 'json' in media_type(content_type):
        doc = json.loads(body)
        jsonschema.validate(doc, media['schema'])
        if media_type(content_type) == 'application/problem+json':
            assert doc['status'] == response.status
        return doc
    text = body.decode()
    jsonschema.validate(text, media['schema'])
    return text


# ---- a running dormantd ------------------------------------------------------

class Daemon(Dormantd):
    def __init__(self, *args, env=None):
        self.tmp = tempfile.TemporaryDirectory()
        super().__init__(DORMANTD, self.tmp.name, 'dormantd', *args, keep='4MiB',
                         discard='4MiB',
                         env=dict({'DORMANT_HOST_DEVICE_BYTES': '256MiB'}, **(env or {})))
        # the port file is written first, then this line
        want = 'dormantd listening on http://127.0.0.1:%d\n' % self.port
        deadline = time.monotonic() + 10
        while want not in self.output() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert want in self.output(), self.output()

    def request(self, method, path, body=None, headers=None, check_spec=True):
        conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=60)
        headers = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers.setdefault('Content-Type', 'application/json')
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        route = path.split('?')[0]
        doc = check(response, route, method, data) if check_spec else data
        return response, doc

    def stop(self):
        try:
            return super().stop(timeout_s=60)
        finally:
            self.tmp.cleanup()


@pytest.fixture
def daemon():
    d = Daemon('--fail-wakes', '1')
    yield d
    assert d.stop() == 0


@pytest.fixture
def guarded():
    d = Daemon('--token', TOKEN, '--open-probes')
    yield d
    assert d.stop() == 0


AUTH = {'Authorization': 'Bearer ' + TOKEN}


# ---- the routes ----------------------------------------------------------------

def test_reads(daemon):
    _, doc = daemon.request('GET', '/healthz')
    assert doc == {'status': 'ok'}
    _, doc = daemon.request('GET', '/readyz')
    assert doc == {'status': 'ready'}
    _, doc = daemon.request('GET', '/is_sleeping')
    assert doc == {'is_sleeping': False}
    _, doc = daemon.request('GET', '/stats')
    assert doc['backend'] == 'host'
    assert {t['tag']: t['policy'] for t in doc['tags']} == {'weights': 'keep', 'grads': 'discard'}
    assert doc['extra']['verifications'] == 0
    # ?pretty indents the same document; plain /stats is one compact line
    _, compact = daemon.request('GET', '/stats', check_spec=False)
    assert b'\n' not in compact.strip()
    for query in ('pretty', 'pretty=1', 'pretty=true'):
        response, doc = daemon.request('GET', '/stats?' + query)
        assert response.status == 200
        assert doc['backend'] == 'host' and doc['extra']['verifications'] == 0
        _, raw = daemon.request('GET', '/stats?' + query, check_spec=False)
        assert raw.startswith(b'{\n  "'), raw[:40]
        assert json.loads(raw).keys() == json.loads(compact).keys()
    response, _ = daemon.request('GET', '/stats?pretty=0', check_spec=False)
    assert response.status == 200
    response, _ = daemon.request('GET', '/stats?pretty=maybe')
    assert response.status == 400
    response, text = daemon.request('GET', '/metrics')
    assert response.status == 200
    assert 'dormant_demo_verifications_total 0\n' in text
    response, text = daemon.request('GET', '/openapi.yaml')
    assert response.status == 200
    assert text.encode() == SPEC_BYTES


def test_cycle_native_routes_and_verification(daemon):
    response, doc = daemon.request('POST', '/sleep')
    assert response.status == 200 and doc['state'] == 'asleep' and doc['changed']
    _, doc = daemon.request('GET', '/stats')
    assert doc['state'] == 'asleep' and doc['last_sleep']['result'] == 'ok'
    assert doc['last_wake'] is None
    # the first wake fails as if the GPU were taken (--fail-wakes 1)
    response, doc = daemon.request('POST', '/wake', {'tags': None})
    assert response.status == 503
    assert doc['type'] == 'urn:dormant:problem:out-of-memory'
    assert int(response.getheader('Retry-After')) > 0
    assert doc['report']['result'] == 'ENOMEM' and doc['report']['state'] == 'asleep'
    _, doc = daemon.request('GET', '/stats')
    assert doc['last_wake']['result'] == 'ENOMEM' and 'error' in doc['last_wake']
    # the same request again works
    response, doc = daemon.request('POST', '/wake', {'tags': None})
    assert response.status == 200 and doc['state'] == 'awake'
    # the library verified the kept chunks' checksums (on by default)
    assert doc['chunks_verified'] > 0 and doc['chunk_mismatches'] == 0
    _, stats = daemon.request('GET', '/stats')
    assert stats['verify'] is True
    assert stats['counters']['chunks_verified_total'] == doc['chunks_verified']
    assert stats['last_wake']['chunks_verified'] == doc['chunks_verified']
    # the trainer verifies both tags after the wake
    for _ in range(600):
        _, doc = daemon.request('GET', '/stats')
        if doc['extra']['verifications'] >= 2:
            break
        time.sleep(0.05)
    assert doc['extra']['verifications'] >= 2
    assert doc['extra']['mismatches'] == 0
    _, text = daemon.request('GET', '/metrics')
    assert 'dormant_demo_mismatches_total 0\n' in text


def test_compatible_routes(daemon):
    response, doc = daemon.request('POST', '/sleep?level=1&mode=abort')
    assert response.status == 200
    _, doc = daemon.request('GET', '/is_sleeping')
    assert doc == {'is_sleeping': True}
    # --fail-wakes 1: the first wake is refused, whatever its route
    response, _ = daemon.request('POST', '/wake_up?tags=weights')
    assert response.status == 503
    response, doc = daemon.request('POST', '/wake_up?tags=weights&tags=nope')
    assert response.status == 200 and doc['state'] == 'mixed'
    assert doc['ignored_tags'] == ['nope']
    response, doc = daemon.request('POST', '/resume_memory_occupation', {'tags': None})
    assert response.status == 200 and doc['state'] == 'awake' and doc['success'] is True
    response, doc = daemon.request('POST', '/release_memory_occupation',
                                   {'tags': ['kv_cache'], 'rid': None})
    assert response.status == 200
    assert [t['tag'] for t in doc['tags']] == ['grads']
    response, doc = daemon.request('GET', '/resume_memory_occupation', {'tags': ['grads']})
    assert response.status == 200 and doc['changed']
    response, doc = daemon.request('GET', '/release_memory_occupation')
    assert response.status == 200 and doc['state'] == 'asleep'
    response, doc = daemon.request('POST', '/wake')
    assert response.status == 200
    for method in ('GET', 'POST'):
        response, doc = daemon.request(method, '/flush_cache')
        assert response.status == 200 and doc['success'] is True


def test_errors(daemon):
    # --fail-wakes 1: the first wake that maps memory is refused; spend it
    response, _ = daemon.request('POST', '/sleep')
    assert response.status == 200
    response, _ = daemon.request('POST', '/wake')
    assert response.status == 503
    response, _ = daemon.request('POST', '/wake')
    assert response.status == 200
    response, doc = daemon.request('POST', '/sleep', {'tags': ['nope']})
    assert response.status == 404 and doc['report']['result'] == 'ENOENT'
    for route in ('/sleep', '/wake', '/wake_up', '/release_memory_occupation',
                  '/resume_memory_occupation'):
        compat = route not in ('/sleep', '/wake')
        response, _ = daemon.request('POST', route, {'tags': ['nope']})
        assert response.status == (200 if compat else 404)
        response, doc = daemon.request('POST', route, {'tags': 'weights'})
        assert response.status == 400
        if route.endswith('_occupation'):
            assert doc['success'] is False and doc['error']['message'] == doc['detail']
        response, _ = daemon.request('POST', route, b'{"tags": [', {'Content-Type': 'application/json'})
        assert response.status == 400
        response, _ = daemon.request('POST', route, {'tag': ['weights']})
        assert response.status == (200 if compat else 400)
        if route != '/wake_up':  # vLLM reads no body: a form is ignored
            response, _ = daemon.request('POST', route, b'tags=weights',
                                         {'Content-Type': 'application/x-www-form-urlencoded'})
            assert response.status == 415
        response, _ = daemon.request('POST', route, b' ' * 70000, {'Content-Type': 'application/json'})
        assert response.status == 413
        if route.endswith('_occupation'):
            response, _ = daemon.request('HEAD', route, check_spec=False)
            assert response.status == 405 and response.getheader('Allow') == 'GET, POST'
        else:
            response, _ = daemon.request('GET', route)
            assert response.status == 405 and response.getheader('Allow') == 'POST'
    response, _ = daemon.request('POST', '/sleep', b'x' * 70000, {'Content-Type': 'application/json'})
    assert response.status == 413
    response, _ = daemon.request('POST', '/sleep', {'tags': ['weights', 'nope']})
    assert response.status == 404
    response, _ = daemon.request('POST', '/sleep?level=9')
    assert response.status == 400
    response, _ = daemon.request('POST', '/sleep?mode=later')
    assert response.status == 400
    for route in ('/stats', '/healthz', '/readyz', '/is_sleeping', '/metrics', '/openapi.yaml'):
        response, _ = daemon.request('POST', route)
        assert response.status == 405 and response.getheader('Allow') == 'GET, HEAD'
        response, _ = daemon.request('GET', route + '?unknown=1')
        # vLLM's GET /is_sleeping ignores parameters
        assert response.status == (200 if route == '/is_sleeping' else 400)
        response, _ = daemon.request('GET', route, b' ' * 70000)
        assert response.status == 413
    response, doc = daemon.request('GET', '/no/such/path')
    assert response.status == 404 and doc['type'] == 'urn:dormant:problem:not-found'


def test_authentication(guarded):
    for route in ('/stats', '/is_sleeping', '/openapi.yaml'):
        response, doc = guarded.request('GET', route)
        assert response.status == 401
        assert response.getheader('WWW-Authenticate').startswith('Bearer')
        response, doc = guarded.request('GET', route, headers={'Authorization': 'Bearer nope'})
        assert response.status == 401
        response, doc = guarded.request('GET', route, headers=AUTH)
        assert response.status == 200
    for route in ('/sleep', '/wake', '/wake_up', '/release_memory_occupation',
                  '/resume_memory_occupation', '/flush_cache'):
        response, _ = guarded.request('POST', route)
        assert response.status == 401
    response, _ = guarded.request('GET', '/no/such/path')
    assert response.status == 401
    # the probes are open (--open-probes)
    for route in ('/healthz', '/readyz', '/metrics'):
        response, _ = guarded.request('GET', route)
        assert response.status == 200
    response, _ = guarded.request('POST', '/sleep', headers=AUTH)
    assert response.status == 200
    response, _ = guarded.request('POST', '/wake', headers=AUTH)
    assert response.status == 200


@pytest.fixture
def checkpointing():
    # the first restore fails as a driver's would, once
    # the simulated device holds 8 MiB for the process outside tags, as a
    # CUDA context does
    d = Daemon('--fault', 'wake:restore:1:EIO:1', env={'DORMANT_HOST_RESIDUE_BYTES': '8MiB'})
    yield d
    assert d.stop() == 0


def metric(text, line_start):
    for line in text.splitlines():
        if line.startswith(line_start + ' '):
            return float(line.split()[-1])
    raise AssertionError('%s not in /metrics' % line_start)


def test_residue_checkpoint_through_the_body(checkpointing):
    d = checkpointing
    _, stats = d.request('GET', '/stats')
    assert stats['residue']['mode'] == 'keep' and stats['residue']['state'] == 'resident'
    # a sleep that keeps the residue (the option's default) makes no checkpoint
    response, doc = d.request('POST', '/sleep')
    assert response.status == 200 and doc['residue']['action'] == 'none'
    response, doc = d.request('POST', '/wake')
    assert response.status == 200 and doc['residue']['action'] == 'none'
    # this sleep's body asks for the checkpoint
    response, doc = d.request('POST', '/sleep', {'tags': None, 'residue': 'checkpoint'})
    assert response.status == 200 and doc['state'] == 'asleep'
    assert doc['residue']['action'] == 'checkpoint'
    assert doc['residue']['result'] == 'ok'
    assert doc['residue']['state'] == 'checkpointed'
    _, stats = d.request('GET', '/stats')
    assert stats['residue']['state'] == 'checkpointed'
    assert stats['residue']['checkpoints'] == 1
    assert stats['residue']['helper_pid'] > 0
    assert stats['residue']['residue_bytes'] == 8 << 20
    assert stats['residue']['calls_while_checkpointed'] == 0
    _, text = d.request('GET', '/metrics')
    assert metric(text, 'dormant_residue_state{mode="keep",state="checkpointed"}') == 1
    assert metric(text, 'dormant_residue_operations_total{op="checkpoint",result="ok"}') == 1
    # a wake's body takes no residue; a sleep's only keep, checkpoint or null
    response, doc = d.request('POST', '/wake', {'residue': 'checkpoint'})
    assert response.status == 400 and 'no field' in doc['detail'] or 'residue' in doc['detail']
    for bad in ('later', 1, True, ['checkpoint']):
        response, doc = d.request('POST', '/sleep', {'residue': bad})
        assert response.status == 400 and 'residue' in doc['detail'], (bad, doc)
    # the restore fails (injected): 503 restore-failed, asleep, retryable
    response, doc = d.request('POST', '/wake')
    assert response.status == 503, doc
    assert doc['type'] == 'urn:dormant:problem:restore-failed'
    assert int(response.getheader('Retry-After')) > 0
    assert doc['report']['state'] == 'asleep'
    assert doc['report']['residue']['action'] == 'restore'
    assert doc['report']['residue']['result'] == 'EIO'
    _, stats = d.request('GET', '/stats')
    assert stats['residue']['state'] == 'checkpointed'
    assert stats['residue']['restore_failures'] == 1
    # the same request again restores and wakes, every kept byte verified
    response, doc = d.request('POST', '/wake')
    assert response.status == 200 and doc['state'] == 'awake'
    assert doc['residue']['action'] == 'restore' and doc['residue']['result'] == 'ok'
    assert doc['chunks_verified'] > 0 and doc['chunk_mismatches'] == 0
    _, stats = d.request('GET', '/stats')
    assert stats['residue']['state'] == 'resident' and stats['residue']['restores'] == 1
    _, text = d.request('GET', '/metrics')
    assert metric(text, 'dormant_residue_operations_total{op="restore",result="failed"}') == 1
    assert metric(text, 'dormant_residue_operations_total{op="restore",result="ok"}') == 1


def test_every_route_and_the_statuses_dormantd_can_give_were_checked():
    """Runs last (pytest keeps file order): every operation's 200, and every
    error status a plain dormantd can be made to give, was validated."""
    for path, ops in SPEC['paths'].items():
        for method in ops:
            assert (path, method.upper(), '200') in CHECKED, (path, method)
    for path, method, status in [('/sleep', 'POST', s) for s in
                                 ('400', '401', '404', '413', '415')] + \
            [('/wake', 'POST', '503'), ('/wake_up', 'POST', '503'), ('/sleep', 'GET', '405'),
             ('/stats', 'GET', '400'), ('/stats', 'GET', '401'), ('/stats', 'POST', '405'),
             ('/stats', 'GET', '413'), ('/no/such/path', 'GET', '404')]:
        assert (path, method, status) in CHECKED, (path, method, status)
