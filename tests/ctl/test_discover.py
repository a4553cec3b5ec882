# SPDX-License-Identifier: MIT
"""Discovery records end to end: colocated dormantd processes on port 0
publish where they listen (--publish, $DORMANT_PUBLISH), and dormantctl
--discover and dormant.client.Client.discover() find, sleep and wake them
together; stale records are skipped, bad ones skipped by name with a warning
(the attacks on who discovery trusts are in test_discover_trust.py)."""
import json
import os
import signal
import sys

import pytest

from conftest import DORMANTD
from test_dormantctl import FAST, ctl, ctl_json

# generous: a loaded CI machine (the sleeps and wakes here take milliseconds
# when it is not); it only bounds a hang
CLIENT_TIMEOUT_S = 120

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from dormant.client import AsyncClient, Client, RecordWarning, discover  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dormantd_process import Dormantd  # noqa: E402


@pytest.fixture
def group(tmp_path):
    """An actor and a critic sharing a node (and a GPU): both on port 0,
    published in one runtime directory, one by flag, one by environment."""
    run = tmp_path / "run"
    actor = Dormantd(DORMANTD, tmp_path, "actor", f"--publish={run}", "--role", "actor",
                     env={"RANK": "0", "LOCAL_RANK": "0"})
    critic = Dormantd(DORMANTD, tmp_path, "critic",
                      env={"DORMANT_PUBLISH": str(run), "DORMANT_ROLE": "critic",
                           "RANK": "1", "LOCAL_RANK": "0"})
    yield run, actor, critic
    for d in (actor, critic):
        d.stop()


def records(run):
    return sorted(p for p in os.listdir(run) if p.endswith(".json"))


def test_records_say_where_each_server_listens(group):
    run, actor, critic = group
    assert len(records(run)) == 2
    # 0700: other users on the node neither read nor plant records
    assert os.stat(run).st_mode & 0o777 == 0o700
    found = discover(run)
    assert [r.url for r in found] == [actor.url, critic.url]  # by rank
    assert [(r.role, r.rank, r.local_rank, r.pid) for r in found] == [
        ("actor", 0, 0, actor.proc.pid), ("critic", 1, 0, critic.proc.pid)]
    assert [r.port for r in found] == [actor.port, critic.port]
    # the start time names the process even once its pid is reused
    from dormant.client import _start_ticks
    for name in records(run):
        doc = json.loads((run / name).read_text())
        assert doc["start_ticks"] == _start_ticks(doc["pid"]) is not None
    assert [r.url for r in discover(run, role="critic")] == [critic.url]


def test_dormantctl_discovers_sleeps_and_wakes_the_group(group):
    run, actor, critic = group
    p, doc = ctl_json(*FAST, f"--discover={run}", "sleep")
    assert p.returncode == 0, p.stderr
    assert [r["endpoint"] for r in doc["results"]] == [f"127.0.0.1:{actor.port}",
                                                       f"127.0.0.1:{critic.port}"]
    assert all(r["state"] == "asleep" for r in doc["results"])
    p, doc = ctl_json(*FAST, f"--discover={run}", "--role", "critic", "wake")
    assert p.returncode == 0, p.stderr
    assert [r["endpoint"] for r in doc["results"]] == [f"127.0.0.1:{critic.port}"]
    p, doc = ctl_json(*FAST, "stats", actor.endpoint, critic.endpoint)
    assert [r["state"] for r in doc["results"]] == ["asleep", "awake"]
    # the default directory comes from $DORMANT_RUNTIME_DIR
    p = ctl(*FAST, "--discover", "wake", env={"DORMANT_RUNTIME_DIR": str(run)})
    assert p.returncode == 0, p.stderr
    p, doc = ctl_json(*FAST, "stats", actor.endpoint, critic.endpoint)
    assert [r["state"] for r in doc["results"]] == ["awake", "awake"]


def test_client_discovers_sleeps_and_wakes_the_group(group):
    run, actor, critic = group
    ranks = Client.discover(run, timeout=CLIENT_TIMEOUT_S, retries=0)
    assert [r.role for r in ranks.records] == ["actor", "critic"]
    assert [r.state for r in ranks.sleep()] == ["asleep", "asleep"]
    assert [r.state for r in ranks.wake()] == ["awake", "awake"]

    import asyncio

    async def cycle():
        async with AsyncClient.discover(run, role="actor", timeout=CLIENT_TIMEOUT_S) as one:
            return [r.state for r in await one.sleep()]

    assert asyncio.run(cycle()) == ["asleep"]
    os.environ["DORMANT_RUNTIME_DIR"] = str(run)
    try:
        ranks = Client.discover(timeout=CLIENT_TIMEOUT_S)
        assert [r.state for r in ranks.wake()] == ["awake", "awake"]
    finally:
        del os.environ["DORMANT_RUNTIME_DIR"]


def test_clean_stop_removes_the_record_and_a_killed_server_leaves_a_stale_one(group):
    run, actor, critic = group
    assert critic.stop() == 0
    assert len(records(run)) == 1
    actor.proc.send_signal(signal.SIGKILL)
    actor.proc.wait()
    assert len(records(run)) == 1  # left behind, its pid dead
    stale = []
    assert discover(run, stale=stale) == []
    assert [r.pid for r in stale] == [actor.proc.pid]
    p = ctl(*FAST, f"--discover={run}", "sleep")
    assert p.returncode == 2
    assert "no live server" in p.stderr and "1 stale record" in p.stderr, p.stderr
    with pytest.raises(ValueError, match="no live server.*1 stale"):
        Client.discover(run)


def test_a_reused_pid_is_stale(group):
    run, actor, critic = group
    # this test process is alive, but did not start at that time
    (run / "reused.json").write_text(json.dumps({
        "version": 1, "pid": os.getpid(), "start_ticks": 1, "url": "http://127.0.0.1:1",
        "role": "actor"}))
    assert [r.url for r in discover(run)] == [actor.url, critic.url]
    p, doc = ctl_json(*FAST, f"--discover={run}", "health")
    assert p.returncode == 0 and len(doc["results"]) == 2, p.stderr


@pytest.mark.parametrize("text, why", [
    ('{"version": 1, "pid": ', "malformed JSON"),
    ('[1, 2]', "not a JSON object"),
    ('{"version": 2, "pid": 1, "url": "http://127.0.0.1:1"}', '"version"'),
    ('{"version": 1, "pid": "1", "url": "http://127.0.0.1:1"}', '"pid"'),
    ('{"version": 1, "pid": 1, "url": "ftp://x"}', '"url"'),
    ('{"version": 1, "pid": 1, "url": "http://127.0.0.1:1", "rank": -1}', '"rank"'),
])
def test_a_bad_record_is_skipped_by_name(group, text, why):
    run, actor, critic = group
    (run / "bad.json").write_text(text)
    p, doc = ctl_json(*FAST, f"--discover={run}", "sleep")
    # one bad file never keeps the others from being found (issue 25)
    assert p.returncode == 0, p.stderr
    assert [r["state"] for r in doc["results"]] == ["asleep", "asleep"]
    line = [l for l in p.stderr.splitlines() if "bad.json" in l]
    assert len(line) == 1, p.stderr
    assert f"warning: --discover: {run}/bad.json: skipped, not a dormant discovery record" \
        in line[0] and why in line[0], p.stderr
    with pytest.warns(RecordWarning, match="bad.json: skipped") as caught:
        ranks = Client.discover(run, timeout=10, retries=0)
    assert why in str(caught[0].message)
    assert [r.state for r in ranks.wake()] == ["awake", "awake"]


def test_other_files_are_not_records(group):
    run, actor, critic = group
    (run / ".1234-0.tmp").write_text("half a rec")
    (run / "notes.txt").write_text("hello")
    assert len(discover(run)) == 2


def test_bad_role_and_bad_environment_are_refused(tmp_path):
    with pytest.raises(RuntimeError, match="role"):
        Dormantd(DORMANTD, tmp_path, "r", f"--publish={tmp_path}/run", "--role", "a b")
    with pytest.raises(RuntimeError, match="DORMANT_PUBLISH"):
        Dormantd(DORMANTD, tmp_path, "e", env={"DORMANT_PUBLISH": "yes"})
    p = ctl("--role", "actor", "sleep", "127.0.0.1:1")
    assert p.returncode == 2 and "--role applies to --discover only" in p.stderr
    p = ctl(f"--discover={tmp_path}/nowhere", "sleep")
    assert p.returncode == 2 and "nowhere" in p.stderr, p.stderr
