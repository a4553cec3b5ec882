# SPDX-License-Identifier: MIT
"""README.md's curl session, run as written against a real dormantd on the
host backend: every line of the shell block under "Drive the demo with curl",
with only the port changed (dormantd listens on a free one), must exit 0 and
answer what its comment and this file's table say. A README command that
drifts from the server (a route, a flag, a body, a claimed answer), or a
server answer that drifts from the README, fails here; so does a new README
line that this table does not know yet.

Run by meson (suite docs) with DORMANTD, README and SOURCE_ROOT in the
environment."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dormantd_process import Dormantd  # noqa: E402

DORMANTD = os.environ.get('DORMANTD', 'build/tools/dormantd')
README = pathlib.Path(os.environ.get('README', 'README.md'))
ROOT = pathlib.Path(os.environ.get('SOURCE_ROOT', README.resolve().parent))
SECTION = '## Drive the demo with curl'
README_PORT = 8787
# Each line runs right after the previous one answered, faster than a reader
# types: what the README shows must already be there (the demo checks a wake
# before the wake answers, not on the trainer's next step).
# smaller than the demo's 1 GiB each, to keep the suite fast; the test checks
# the sizes the README names are what scripts/demo runs
KEEP_BYTES = DISCARD_BYTES = 64 << 20


def section(text, heading):
    start = text.index(heading)
    end = text.find('\n## ', start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def session():
    """The shell block's commands, each (command, comment)."""
    part = section(README.read_text(), SECTION)
    blocks = re.findall(r'```sh\n(.*?)```', part, re.S)
    assert len(blocks) == 1, f'one ```sh block under {SECTION!r}, found {len(blocks)}'
    lines = []
    for raw in blocks[0].splitlines():
        if not raw.strip() or raw.lstrip().startswith('#'):
            continue
        command, _, comment = raw.partition('  #')
        lines.append((command.strip(), comment.strip().lstrip('#').strip()))
    return lines


def demo_command():
    """The dormantd command line the section says scripts/demo runs."""
    m = re.search(r'`scripts/demo` runs `(dormantd [^`]*)`', section(README.read_text(), SECTION))
    assert m, 'the section names the dormantd command that scripts/demo runs'
    return ' '.join(m.group(1).split())


def claimed_pairs(comment):
    """'"verifications": 2, "mismatches": 0' -> {'verifications': 2, ...}"""
    if comment.startswith('{'):
        return {}  # a whole answer, compared as it is
    return {k: json.loads(v) for k, v in re.findall(r'"(\w+)":\s*([^,\s}]+)', comment)}


def tags_of(report):
    return {t['tag']: t for t in report['tags']}


# What each README line must answer, beyond exit status 0 and its comment.
def stats_all_awake(out, d):
    s = json.loads(out)
    assert s['state'] == 'awake', s['state']
    assert {t['tag']: t['state'] for t in s['tags']} == {'weights': 'awake', 'grads': 'awake'}
    # "on the device"
    assert all(t['device_bytes'] > 0 for t in s['tags']), s['tags']
    assert out.count('\n') > 10, 'not ?pretty'


def sleep_all(out, d):
    r = json.loads(out)
    assert (r['action'], r['result'], r['state']) == ('sleep', 'ok', 'asleep'), r
    t = tags_of(r)
    # "weights copied to host, GPU memory given back"
    assert t['weights']['bytes_copied'] == KEEP_BYTES, t['weights']
    assert t['grads']['bytes_copied'] == 0, t['grads']
    assert r['bytes_released'] >= KEEP_BYTES + DISCARD_BYTES, r


def is_sleeping(out, d):
    assert json.loads(out) == {'is_sleeping': True}


def wake_all(out, d):
    r = json.loads(out)
    assert (r['action'], r['result'], r['state']) == ('wake', 'ok', 'awake'), r
    t = tags_of(r)
    # "weights restored, grads zeroed"
    assert t['weights']['bytes_copied'] == KEEP_BYTES, t['weights']
    assert t['grads']['bytes_zeroed'] >= DISCARD_BYTES, t['grads']


def extra(out, d):
    e = json.loads(out)
    # one check per tag of the one wake so far
    assert e['mismatches'] == 0 and e['verifications'] == 2, e
    assert e['last_verification'].endswith(': ok'), e


def sleep_grads(out, d):
    r = json.loads(out)
    # "one tag only"
    assert [t['tag'] for t in r['tags']] == ['grads'], r['tags']
    assert (r['action'], r['result'], r['state']) == ('sleep', 'ok', 'mixed'), r


def wake_grads(out, d):
    r = json.loads(out)
    assert [t['tag'] for t in r['tags']] == ['grads'], r['tags']
    assert (r['action'], r['result'], r['state']) == ('wake', 'ok', 'awake'), r


def transitions_total(out, d):
    lines = out.splitlines()
    assert lines and all(line.startswith('dormant_transitions_total') for line in lines), out
    # three sleeps and wakes so far: two of all tags, one of grads
    counts = {}
    for line in lines:
        m = re.match(r'dormant_transitions_total\{(.*)\} (\d+)$', line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        counts[labels.get('kind'), labels.get('result')] = int(m.group(2))
    assert counts.get(('sleep', 'ok')) == 2 and counts.get(('wake', 'ok')) == 2, counts


def unknown(out, d):
    raise AssertionError('a line this test does not know (add it to EXPECT)')


# README line (with the README's port) -> its check; the order is the README's.
EXPECT = {
    'curl -s localhost:8787/stats?pretty': stats_all_awake,
    'curl -s -X POST localhost:8787/sleep': sleep_all,
    'curl -s localhost:8787/is_sleeping': is_sleeping,
    'curl -s -X POST localhost:8787/wake': wake_all,
    'curl -s localhost:8787/stats | jq .extra': extra,
    'curl -s -X POST localhost:8787/sleep --json \'{"tags": ["grads"]}\'': sleep_grads,
    "curl -s -X POST 'localhost:8787/wake?tags=grads'": wake_grads,
    'curl -s localhost:8787/metrics | grep ^dormant_transitions_total': transitions_total,
}


def test_the_session_is_the_one_this_test_knows():
    assert [c for c, _ in session()] == list(EXPECT), (
        'README.md\'s curl session changed: update EXPECT in tests/docs/test_readme_curl.py')


def test_scripts_demo_runs_what_the_readme_says():
    demo = (ROOT / 'scripts' / 'demo').read_text()
    m = re.search(r'^exec build/tools/(dormantd [^\n]*?) "\$@"$', demo, re.M)
    assert m, 'scripts/demo execs build/tools/dormantd'
    assert ' '.join(m.group(1).split()) == demo_command()
    assert f'--listen 127.0.0.1:{README_PORT}' in demo_command()


def run(command, port):
    line = command.replace(f'localhost:{README_PORT}', f'localhost:{port}')
    assert line != command, f'{command!r} does not name localhost:{README_PORT}'
    return subprocess.run(['bash', '-o', 'pipefail', '-c', line], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_every_command_answers_what_the_readme_says(tmp_path):
    # the README's flags but the ones Dormantd sets itself: a free port, the
    # host backend, smaller sizes (the README's are checked against
    # scripts/demo above)
    flags, own = demo_command().split()[1:], ('--listen', '--backend', '--keep', '--discard')
    rest = [f for i, f in enumerate(flags) if f not in own and (i == 0 or flags[i - 1] not in own)]
    d = Dormantd(DORMANTD, tmp_path, 'readme', *rest, keep=str(KEEP_BYTES),
                 discard=str(DISCARD_BYTES))
    try:
        for command, comment in session():
            check = EXPECT.get(command, unknown)
            p = run(command, d.port)
            try:
                assert p.returncode == 0, f'exit status {p.returncode}: {p.stderr}'
                assert 'urn:dormant:problem' not in p.stdout, p.stdout
                out = p.stdout.strip()
                if comment.startswith('{'):  # the answer itself
                    assert json.loads(out) == json.loads(comment), (out, comment)
                for key, value in claimed_pairs(comment).items():  # "key": value, ...
                    assert json.loads(out)[key] == value, (key, out, comment)
                check(out, d)
            except AssertionError as e:
                raise AssertionError(f'README line {command!r} (# {comment}): {e}\n'
                                     f'output: {p.stdout}') from None
    finally:
        log = d.output()
        status = d.stop()
    assert status == 0, log
