# SPDX-License-Identifier: MIT
"""Who discovery trusts: the attacks of issue 25 against dormantctl --discover
and dormant.client.discover() at once. Each test plants a folder or a file,
then asks both readers, which follow one set of rules (docs/orchestrators.md):
the folder must be this user's and writable by no one else, records regular
files of this user, opened without following links or blocking, at most 4096
bytes, their pid a live process of this user that started when the record
says. A bad file is skipped with a warning and never keeps the others from
being found; the token goes only to servers whose record passed.

Where the tests run as root and `setpriv` works (CI), the planting is done as
another user (nobody, 65534); elsewhere those tests are skipped, counted."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import warnings

import pytest

from conftest import DORMANTD
from test_dormantctl import FAST, ctl, ctl_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from dormant.client import Client, RecordWarning, _start_ticks, discover  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dormantd_process import Dormantd  # noqa: E402

NOBODY = 65534
TOKEN = "s3cret-token-for-the-real-servers"


def _setpriv_works():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                        "true"], capture_output=True, check=False)
    return p.returncode == 0


TWO_USERS = _setpriv_works()
two_users = pytest.mark.skipif(not TWO_USERS,
                               reason="needs root and a working setpriv to act as another user")


def as_nobody(*argv, stdin=None):
    """Run argv as another user (nobody), checked."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    *argv], check=True, timeout=60, input=stdin, text=True)


@pytest.fixture
def trap(mock):
    """The attacker's listener: answers everything 200, keeps what it got."""
    return mock(lambda h: (200, {"Content-Type": "application/json"},
                           b'{"state": "asleep", "changed": true, "tags": {}}'))


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def real(tmp_path):
    """One real server with a token, published in a private folder."""
    run = tmp_path / "run"
    d = Dormantd(DORMANTD, tmp_path, "real", f"--publish={run}", "--token", TOKEN)
    yield run, d
    d.stop()


def record(url, pid=None, ticks=None, **extra):
    pid = os.getpid() if pid is None else pid
    doc = {"version": 1, "pid": pid, "url": url,
           "start_ticks": _start_ticks(pid) if ticks is None else ticks}
    doc.update(extra)
    return json.dumps(doc)


def both_find(run, token_file):
    """What each reader finds in run: (dormantctl's process, its JSON, the
    URLs discover() returns, the warnings discover() gave)."""
    p, doc = ctl_json(*FAST, "--retries", "0", f"--discover={run}", "sleep",
                      env={"DORMANT_TOKEN_FILE": str(token_file)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        urls = [r.url for r in discover(run)]
    return p, doc, urls, [str(w.message) for w in caught if w.category is RecordWarning]


def assert_untouched(trap):
    assert not trap.requests, f"the planted listener was contacted: {trap.requests}"


# ---- the folder ------------------------------------------------------------

@two_users
def test_a_folder_planted_by_another_user_is_refused(tmp_path, trap, token_file, request):
    # /tmp as it is: sticky and open to all; nobody makes "our" folder first
    # (pytest's own folders are closed to nobody: this one is in /tmp)
    shared = tempfile.mkdtemp(prefix="dormant-shared-", dir="/tmp")
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    os.chmod(shared, 0o1777)
    run = pathlib.Path(shared) / "run"
    as_nobody("mkdir", "-m", "0777", str(run))
    # a record naming a live process of ours, as the attack did with pid 1
    as_nobody("sh", "-c", f"cat > {run}/x.json", stdin=record("http://" + trap.endpoint))
    assert os.stat(run).st_uid == NOBODY
    for env in ({}, {"DORMANT_RUNTIME_DIR": str(run)}):
        args = ["--discover"] if env else [f"--discover={run}"]
        p = ctl(*FAST, *args, "sleep", env={"DORMANT_TOKEN_FILE": str(token_file), **env})
        assert p.returncode == 2, p.stderr
        assert f"{run} is owned by uid {NOBODY}, not by this user" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1, p.stderr  # one clear line
    with pytest.raises(PermissionError, match=f"owned by uid {NOBODY}"):
        discover(run)
    with pytest.raises(PermissionError, match=f"owned by uid {NOBODY}"):
        Client.discover(run, token=TOKEN)
    assert_untouched(trap)
    # the writer refuses it too: a server never publishes into it
    with pytest.raises(RuntimeError, match=f"owned by uid {NOBODY}, not by this user"):
        Dormantd(DORMANTD, tmp_path, "w", f"--publish={run}")
    assert os.listdir(run) == ["x.json"]


@two_users
def test_the_writer_refuses_a_folder_it_does_not_own(tmp_path):
    # not open to others: only the owner differs
    run = tmp_path / "theirs"
    run.mkdir(mode=0o755)
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(RuntimeError, match=f"{run} is owned by uid {NOBODY}, not by this user"):
        Dormantd(DORMANTD, tmp_path, "w", f"--publish={run}")
    assert os.listdir(run) == []
    # the same through the environment and the default name's variable
    with pytest.raises(RuntimeError, match=f"owned by uid {NOBODY}"):
        Dormantd(DORMANTD, tmp_path, "e", env={"DORMANT_PUBLISH": "1",
                                               "DORMANT_RUNTIME_DIR": str(run)})
    assert os.listdir(run) == []


def test_a_folder_others_may_write_to_is_refused_by_both_and_the_writer(tmp_path, trap,
                                                                        token_file):
    run = tmp_path / "open"
    run.mkdir()
    run.chmod(0o777)
    (run / "x.json").write_text(record("http://" + trap.endpoint))
    p = ctl(*FAST, f"--discover={run}", "sleep", env={"DORMANT_TOKEN_FILE": str(token_file)})
    assert p.returncode == 2
    assert f"{run} is writable by other users (mode 0777): refused" in p.stderr, p.stderr
    with pytest.raises(PermissionError, match="writable by other users"):
        discover(run)
    with pytest.raises(RuntimeError, match="writable by other users"):
        Dormantd(DORMANTD, tmp_path, "w", f"--publish={run}")
    run.chmod(0o770)  # a group is others too
    with pytest.raises(PermissionError, match=r"mode 0770"):
        discover(run)
    assert_untouched(trap)


def test_a_folder_that_is_a_link_is_refused(tmp_path, real, token_file):
    run, d = real
    link = tmp_path / "link"
    link.symlink_to(run)
    p = ctl(*FAST, f"--discover={link}", "health")
    assert p.returncode == 2 and f"{link} is a symbolic link: refused" in p.stderr, p.stderr
    with pytest.raises(PermissionError, match="symbolic link"):
        discover(link)
    with pytest.raises(RuntimeError, match="symbolic link"):
        Dormantd(DORMANTD, tmp_path, "w", f"--publish={link}")


def test_a_missing_folder_and_a_file_in_its_place(tmp_path):
    p = ctl(*FAST, f"--discover={tmp_path}/none", "health")
    assert p.returncode == 2 and "none" in p.stderr
    with pytest.raises(FileNotFoundError):
        discover(tmp_path / "none")
    (tmp_path / "file").write_text("")
    p = ctl(*FAST, f"--discover={tmp_path}/file", "health")
    assert p.returncode == 2 and "is not a directory" in p.stderr, p.stderr
    with pytest.raises(NotADirectoryError):
        discover(tmp_path / "file")


# ---- the records -----------------------------------------------------------

def planted_cases(run, trap_url, tmp_path):
    """Files that are not this user's records, each with the words of why."""
    outside = tmp_path / "outside.json"
    outside.write_text(record(trap_url))
    (run / "link.json").symlink_to(outside)
    os.mkfifo(run / "fifo.json")
    (run / "junk.json").write_text("not json")
    (run / "big.json").write_text(record(trap_url, pad="x" * 5000))
    (run / "dir.json").mkdir()
    open_file = run / "open.json"
    open_file.write_text(record(trap_url))
    open_file.chmod(0o666)
    return {"link.json": "a symbolic link", "fifo.json": "not a regular file",
            "junk.json": "malformed JSON", "big.json": "larger than 4096 bytes",
            "dir.json": "not a regular file",
            "open.json": "writable by other users (mode 0666)"}


def check_skipped(run, p, caught, cases):
    for name, why in cases.items():
        line = f"{run}/{name}: skipped, not a dormant discovery record of this user"
        assert any(line in w and why in w for w in caught), (name, caught)
        assert any(line in l and why in l for l in p.stderr.splitlines()), (name, p.stderr)


def test_bad_files_are_skipped_with_a_warning_and_the_rest_still_work(tmp_path, real, trap,
                                                                       token_file):
    run, d = real
    cases = planted_cases(run, "http://" + trap.endpoint, tmp_path)
    p, doc, urls, caught = both_find(run, token_file)
    # the real server was found and slept, with the token; no hang on the FIFO
    assert p.returncode == 0, p.stderr
    assert [r["endpoint"] for r in doc["results"]] == [d.endpoint]
    assert doc["results"][0]["state"] == "asleep"
    assert urls == [d.url]
    check_skipped(run, p, caught, cases)
    skipped = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        discover(run, skipped=skipped)
    assert sorted(os.path.basename(path) for path, _ in skipped) == sorted(cases)
    # the same through the class
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranks = Client.discover(run, token=TOKEN, timeout=10, retries=0)
    assert [r.state for r in ranks.wake()] == ["awake"]
    assert_untouched(trap)


def test_nothing_but_bad_files_says_so(tmp_path, trap, token_file):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "junk.json").write_text("{")
    p = ctl(*FAST, f"--discover={run}", "health")
    assert p.returncode == 2
    assert "no live server" in p.stderr and "1 other file skipped" in p.stderr, p.stderr
    with pytest.warns(RecordWarning, match="junk.json"):
        with pytest.raises(ValueError, match="1 other file"):
            Client.discover(run)


@two_users
def test_a_record_of_another_user_is_skipped(tmp_path, real, trap, token_file):
    run, d = real
    theirs = run / "theirs.json"
    theirs.write_text(record("http://" + trap.endpoint))
    os.chown(theirs, NOBODY, NOBODY)
    p, doc, urls, caught = both_find(run, token_file)
    assert p.returncode == 0, p.stderr
    assert urls == [d.url] and len(doc["results"]) == 1
    check_skipped(run, p, caught, {"theirs.json": f"owned by uid {NOBODY}, not by this user"})
    assert_untouched(trap)


@pytest.mark.parametrize("pid_of", ["init", "gone", "reused", "no start time"])
def test_a_record_whose_process_is_not_its_server_is_stale(tmp_path, real, trap, token_file,
                                                           pid_of):
    run, d = real
    url = "http://" + trap.endpoint
    if pid_of == "init":  # alive, and its true start time: still not a server of ours
        text = record(url, pid=1, ticks=_start_ticks(1) or 1)
    elif pid_of == "gone":
        child = subprocess.Popen(["true"])
        child.wait()
        text = record(url, pid=child.pid, ticks=12345)
    elif pid_of == "reused":  # this process, but it started at another time
        text = record(url, ticks=_start_ticks(os.getpid()) + 1)
    else:
        text = json.dumps({"version": 1, "pid": os.getpid(), "url": url})
    (run / "planted.json").write_text(text)
    p, doc, urls, caught = both_find(run, token_file)
    assert p.returncode == 0, p.stderr
    assert urls == [d.url] and [r["endpoint"] for r in doc["results"]] == [d.endpoint]
    assert caught == []  # stale, not bad
    stale = []
    discover(run, stale=stale)
    assert [r.file for r in stale] == ["planted.json"]
    assert_untouched(trap)


@two_users
def test_a_record_naming_another_users_live_process_is_stale(tmp_path, real, trap,
                                                             token_file):
    run, d = real
    theirs = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               "--clear-groups", "sleep", "60"])
    try:
        # wait for the exec, so that the start time read is the process's own
        for _ in range(500):
            if os.stat(f"/proc/{theirs.pid}").st_uid == NOBODY:
                break
            subprocess.run(["sleep", "0.01"], check=False)
        (run / "planted.json").write_text(record("http://" + trap.endpoint, pid=theirs.pid))
        p, doc, urls, caught = both_find(run, token_file)
        assert p.returncode == 0, p.stderr
        assert urls == [d.url] and len(doc["results"]) == 1
    finally:
        theirs.kill()
        theirs.wait()
    assert_untouched(trap)
