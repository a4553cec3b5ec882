# SPDX-License-Identifier: MIT
"""dormant.client: drive many dormant servers over HTTP from an orchestrator.

    from dormant.client import Client, RankError
    ranks = Client(["10.0.0.1:8787", "10.0.0.2:8787", "unix:/run/dormant.sock"])
    ranks.sleep()                    # every rank, at most `concurrency` at once
    ...rollout...
    ranks.wake(["weights"])          # raises RankError naming every failed rank

    async with AsyncClient(dns="trainer.ns.svc", ports="8787-8794") as ranks:
        results = await ranks.stats()

Calls: sleep(tags), wake(tags), stats(), health(), ready(), and
sleep_together(tags), wake_together(tags) for the ranks of one job (every
request in flight at once: NCCL's suspend is collective). Standard
library only; importing it does not load libdormant. The endpoint
forms, the retry policy and the token sources are those of dormantctl
(docs/operations.md): HOST[:PORT], [IPV6][:PORT], http://HOST:PORT,
https://HOST:PORT, unix:/PATH (or a bare absolute socket path), and dns=NAME
for every address a name resolves to (a Kubernetes headless Service) on each
of `ports`. A 503 (honouring Retry-After) and a connection error are retried
with doubling, jittered delays; a 409 is retried only after an attempt of
the same request timed out once sent (the server may still be running it).

Servers that publish discovery records (dormantd --publish, serve(publish=
True), $DORMANT_PUBLISH=1) are found with Client.discover(dir=None,
role=None): every live server of the node, however many share a GPU and
whatever ports they were given.

Each call returns one RankResult per endpoint, in endpoint order. When any
rank failed it raises RankError instead (pass raise_on_error=False to get
the results alone), whose message names every failed rank.
"""
import asyncio
import concurrent.futures
import errno
import functools
import http.client
import ipaddress
import json
import os
import random
import socket
import ssl
import stat
import time
import warnings
from dataclasses import dataclass, field
from typing import (Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type,
                    TypeVar, Union)

from .errors import DormantError

__all__ = ["Client", "AsyncClient", "RankResult", "RankError", "parse_endpoints",
           "discover", "Record", "RecordWarning", "runtime_dir", "DEFAULT_PORT"]

DEFAULT_PORT = 8787
TOKEN_MAX = 4096
PROBLEM_PREFIX = "urn:dormant:problem:"
_RESPONSE_MAX = 16 << 20  # bytes of one answer at most


# ---- endpoints -------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    """One server: `name` as reports show it (host:port or unix:/path)."""
    name: str
    scheme: str = "http"
    host: str = ""
    port: int = DEFAULT_PORT
    unix_path: Optional[str] = None


def _parse_ports(spec):
    """8787, "8787-8794", "8787,9000" or a list of ints -> list of ports."""
    if spec is None:
        return []
    if isinstance(spec, int):
        spec = [spec]
    if isinstance(spec, str):
        out = []
        for part in spec.split(","):
            first, dash, last = part.partition("-")
            try:
                lo = int(first)
                hi = int(last) if dash else lo
            except ValueError:
                raise ValueError(f"bad port '{part}' (1 to 65535, or FIRST-LAST)") from None
            if not (first.isdigit() and (not dash or last.isdigit())) or hi < lo:
                raise ValueError(f"bad port '{part}' (1 to 65535, or FIRST-LAST)")
            out.extend(range(lo, hi + 1))
        spec = out
    ports = []
    for p in spec:
        if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535:
            raise ValueError(f"bad port {p!r} (1 to 65535)")
        if p in ports:
            raise ValueError(f"port {p} listed twice")
        ports.append(p)
    return ports


def _host_valid(host):
    return (0 < len(host) <= 253 and host[0] not in "-." and
            all(c.isascii() and (c.isalnum() or c in "-._") for c in host))


def _parse_one(spec, ports):
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"bad endpoint {spec!r}: empty or not a string")
    if spec.startswith("unix:") or spec.startswith("/"):
        path = spec[5:] if spec.startswith("unix:") else spec
        if not path or any(ord(c) < 32 or c == "\x7f" for c in path):
            raise ValueError(f"'{spec}': empty socket path or a control character in it")
        return [Endpoint(f"unix:{path}", "http", "localhost", 0, path)]
    scheme, authority = "http", spec
    if spec.startswith("http://"):
        authority = spec[7:]
    elif spec.startswith("https://"):
        scheme, authority = "https", spec[8:]
    elif "://" in spec:
        raise ValueError(f"'{spec}': only http://, https:// and unix: endpoints")
    if authority.endswith("/"):
        authority = authority[:-1]
    if any(c in authority for c in "/@?#"):
        raise ValueError(f"'{spec}': an endpoint is host[:port], without path or user")
    port = None
    if authority.startswith("["):
        host, close, rest = authority[1:].partition("]")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"'{spec}': bad IPv6 address") from None
        host = f"[{host}]"
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"'{spec}': expected ':' after ']'")
            port = rest[1:]
    elif authority.count(":") > 1:
        try:
            ipaddress.IPv6Address(authority)
        except ValueError:
            raise ValueError(f"'{spec}': bad IPv6 address (write [ADDRESS]:PORT "
                             "to give a port)") from None
        host = f"[{authority}]"
    else:
        host, colon, port = authority.partition(":")
        if not _host_valid(host):
            raise ValueError(f"'{spec}': bad host name")
        if not colon:
            port = None
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"'{spec}': bad port (1 to 65535)")
        use = [int(port)]
    else:
        use = ports or [DEFAULT_PORT]
    prefix = "https://" if scheme == "https" else ""
    return [Endpoint(f"{prefix}{host}:{p}", scheme, host.strip("[]"), p) for p in use]


def _resolve(name, family, ports):
    if not _host_valid(name):
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            raise ValueError(f"dns '{name}': bad host name") from None
    try:
        infos = socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"dns {name}: {e.strerror}") from None
    found = set()
    for fam, _, _, _, addr in infos:
        if fam in (socket.AF_INET, socket.AF_INET6):
            found.add(ipaddress.ip_address(addr[0].split("%")[0]))
    # as dormantctl: IPv4 first, then by address
    ordered = sorted(found, key=lambda a: (a.version, int(a)))
    out = []
    for a in ordered:
        host = str(a) if a.version == 4 else f"[{a}]"
        for p in ports or [DEFAULT_PORT]:
            out.append(Endpoint(f"{host}:{p}", "http", str(a), p))
    return out


def parse_endpoints(endpoints: Union[str, Iterable[str], None] = None, *,
                    dns: Union[str, Iterable[str], None] = None,
                    ports: Union[str, int, Iterable[int], None] = None,
                    family: Optional[int] = None) -> List[Endpoint]:
    """The endpoint list a Client uses, duplicates dropped, in order given.

    endpoints: one string or a list of them (the forms above); dns: a name
    whose every address is an endpoint on each of `ports`; ports: for dns and
    for endpoints written without one (default 8787); family: socket.AF_INET
    or AF_INET6 to keep one family of dns addresses. Raises ValueError."""
    ports = _parse_ports(ports)
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    out, seen = [], set()
    found = []
    for spec in endpoints or []:
        found.extend(_parse_one(spec, ports))
    if dns is not None:
        found.extend(_resolve(dns, family or 0, ports))
    for e in found:
        if e.name not in seen:
            seen.add(e.name)
            out.append(e)
    if not out:
        raise ValueError("no endpoints (give endpoints or dns)")
    return out


# ---- discovery records -----------------------------------------------------

RECORD_VERSION = 1
_RECORD_MAX = 4096


@dataclass(frozen=True)
class Record:
    """One server's discovery record (docs/orchestrators.md)."""
    file: str
    pid: int
    url: str
    port: Optional[int] = None
    host: Optional[str] = None
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    role: Optional[str] = None
    started_unix_s: Optional[float] = None


def runtime_dir(dir: Union[str, "os.PathLike[str]", None] = None) -> str:
    """The directory of discovery records: dir, else $DORMANT_RUNTIME_DIR,
    else $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID (as the servers)."""
    if dir:
        return os.fspath(dir)
    if os.environ.get("DORMANT_RUNTIME_DIR"):
        return os.environ["DORMANT_RUNTIME_DIR"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "dormant")
    return f"/tmp/dormant-{os.getuid()}"


def _start_ticks(pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class RecordWarning(UserWarning):
    """A file of the discovery directory that was skipped (not a record of
    this user); the message names it and says why."""


def _live(pid, start_ticks):
    """A process of this user that started at start_ticks: pid 1, another
    user's process and a reused pid never are (as dormantctl)."""
    if pid <= 1 or start_ticks is None or start_ticks <= 0:
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
    except OSError:
        return False
    return _start_ticks(pid) == start_ticks


def _dir_open(directory):
    """The directory's descriptor, if this user may trust it: no link, a
    directory of this user that no one else may write to (as the writer and
    dormantctl). Raises FileNotFoundError, NotADirectoryError or
    PermissionError with one line saying why."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory):
            raise PermissionError(errno.ELOOP, f"the discovery directory {directory} is a "
                                  "symbolic link: refused") from None
        if e.errno == errno.ENOTDIR:
            raise NotADirectoryError(errno.ENOTDIR, f"the discovery directory {directory} "
                                     "is not a directory") from None
        raise
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = (f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): "
               "refused")
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): refused"
    if why:
        os.close(fd)
        raise PermissionError(errno.EPERM, f"the discovery directory {directory} {why}")
    return fd


def _record_text(dir_fd, name):
    """The bytes of record name: a regular file of this user writable by no
    one else, at most _RECORD_MAX bytes, opened without following a link
    and without blocking (a FIFO never hangs). Raises ValueError (why) or
    FileNotFoundError (removed meanwhile)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError("a symbolic link" if e.errno == errno.ELOOP
                         else os.strerror(e.errno)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid != os.geteuid():
            raise ValueError(f"owned by uid {st.st_uid}, not by this user "
                             f"(uid {os.geteuid()})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o})")
        if st.st_size > _RECORD_MAX:
            raise ValueError(f"larger than {_RECORD_MAX} bytes")
        raw = b""
        while len(raw) <= _RECORD_MAX:
            piece = os.read(fd, _RECORD_MAX + 1 - len(raw))
            if not piece:
                break
            raw += piece
        if len(raw) > _RECORD_MAX:
            raise ValueError(f"larger than {_RECORD_MAX} bytes")
        return raw
    finally:
        os.close(fd)


def _whole(doc, key):
    v = doc.get(key)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise ValueError(f'"{key}" is not a whole number or null')
    return v


def _record(raw, name):
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError('no integer "version"')
    if version != RECORD_VERSION:
        raise ValueError('a "version" this client does not know (upgrade dormant)')
    pid = doc.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= 0x7fffffff:
        raise ValueError('no positive integer "pid"')
    url = doc.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "unix:")):
        raise ValueError('no "url" (http://HOST:PORT or unix:PATH)')
    role = doc.get("role")
    if role is not None and not isinstance(role, str):
        raise ValueError('"role" is neither a string nor null')
    ticks = _whole(doc, "start_ticks")
    started = doc.get("started_unix_s")
    return ticks, Record(name, pid, url, doc.get("port"), doc.get("host"),
                         _whole(doc, "rank"), _whole(doc, "local_rank"),
                         _whole(doc, "world_size"), role,
                         started if isinstance(started, (int, float)) else None)


def discover(dir: Union[str, "os.PathLike[str]", None] = None, role: Optional[str] = None, *,
             stale: Optional[List[Record]] = None,
             skipped: Optional[List[Tuple[str, str]]] = None) -> List[Record]:
    """The live servers that published a discovery record in runtime_dir(dir)
    (of `role` only, if given), ordered by rank, local rank, then pid.

    Only what this user wrote is trusted, by the rules of the writer and of
    dormantctl --discover (docs/orchestrators.md): a directory that is not
    this user's, is writable by others or is a link raises PermissionError
    (NotADirectoryError, FileNotFoundError when missing) and nothing is read.
    A *.json file that is not a regular file of this user writable by no one
    else, is larger than 4096 bytes or is not a record is skipped with a
    RecordWarning naming it (and appended as (path, why) to the list
    `skipped` if one is given); the others are still found. Records whose
    process is gone (pid 1, another user's process, a pid another process now
    has) are skipped, and appended to the list `stale` if one is given."""
    directory = runtime_dir(dir)
    found = []
    dir_fd = _dir_open(directory)
    try:
        for name in sorted(os.listdir(dir_fd)):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            path = os.path.join(directory, name)
            try:
                ticks, rec = _record(_record_text(dir_fd, name), name)
            except FileNotFoundError:
                continue  # removed meanwhile: its server stopped
            except ValueError as e:
                message = (f"{path}: skipped, not a dormant discovery record of this "
                           f"user ({e})")
                warnings.warn(message, RecordWarning, stacklevel=2)
                if skipped is not None:
                    skipped.append((path, str(e)))
                continue
            if not _live(rec.pid, ticks):
                if stale is not None:
                    stale.append(rec)
                continue
            if role is None or rec.role == role:
                found.append(rec)
    finally:
        os.close(dir_fd)
    unknown = 1 << 62
    found.sort(key=lambda r: (unknown if r.rank is None else r.rank,
                              unknown if r.local_rank is None else r.local_rank, r.pid, r.file))
    return found


# ---- tokens ----------------------------------------------------------------

def _token_check(token, source):
    if not token:
        raise ValueError(f"{source}: the token is empty")
    if len(token) > TOKEN_MAX:
        raise ValueError(f"{source}: the token is longer than {TOKEN_MAX} bytes")
    if any(not ("!" <= c <= "~") for c in token):
        raise ValueError(f"{source}: the token has a blank or a character outside "
                         "visible ASCII")
    return token


def _token_file(path, source):
    try:
        with open(path, "rb") as f:
            raw = f.read(TOKEN_MAX + 1)
    except OSError as e:
        raise ValueError(f"{source} {path}: {e.strerror}") from None
    return _token_check(raw.decode("ascii", "replace").rstrip(), str(path))


def load_token(token: Union[str, bool, None] = None,
               token_file: Union[str, "os.PathLike[str]", None] = None,
               environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """token, else token_file, else $DORMANT_TOKEN, else the file named by
    $DORMANT_TOKEN_FILE, else None (as dormantctl); token=False: none, whatever
    the environment says. Raises ValueError."""
    env = os.environ if environ is None else environ
    if token is False:
        return None
    if token is not None:
        return _token_check(token, "token")
    if token_file is not None:
        return _token_file(token_file, "token_file")
    if env.get("DORMANT_TOKEN"):
        return _token_check(env["DORMANT_TOKEN"], "DORMANT_TOKEN")
    if env.get("DORMANT_TOKEN_FILE"):
        return _token_file(env["DORMANT_TOKEN_FILE"], "DORMANT_TOKEN_FILE")
    return None


# ---- results ---------------------------------------------------------------

@dataclass
class RankResult:
    """What one endpoint answered.

    ok: it succeeded; status: the HTTP status (None: no answer); state: the
    state it reported (asleep, awake, ... for sleep, wake and stats; ok for
    health); bytes: bytes released (sleep), mapped (wake) or on the device
    (stats); host_bytes: host bytes (stats); seconds: the transition's own
    duration as the server measured it; changed: whether it changed a tag;
    problem: the problem document (dict) of a failure, when there was one;
    error: one line saying why it failed; body: the parsed answer; attempts:
    requests sent; elapsed_s: time spent, retries included."""
    endpoint: str
    ok: bool = False
    status: Optional[int] = None
    state: Optional[str] = None
    bytes: Optional[int] = None
    host_bytes: Optional[int] = None
    seconds: Optional[float] = None
    changed: Optional[bool] = None
    problem: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    body: Any = field(default=None, repr=False)
    attempts: int = 0
    elapsed_s: float = 0.0


class RankError(DormantError):
    """Some ranks failed. .failed: their RankResults; .results: all of them,
    in endpoint order."""

    def __init__(self, action: str, results: Iterable[RankResult]) -> None:
        self.action = action
        self.results = list(results)
        self.failed = [r for r in self.results if not r.ok]
        lines = "; ".join(f"{r.endpoint}: {r.error}" for r in self.failed)
        super().__init__(f"{action}: {len(self.failed)} of {len(self.results)} ranks "
                         f"failed: {lines}")


def _bytes_of(obj, key):
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _read_report(r, action, report):
    if isinstance(report.get("state"), str):
        r.state = report["state"]
    if isinstance(report.get("changed"), bool):
        r.changed = report["changed"]
    d = report.get("duration_s")
    if isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0:
        r.seconds = float(d)
    r.bytes = _bytes_of(report, "bytes_released" if action == "sleep" else "bytes_mapped")


def _fill(r, action, status, ctype, raw):
    """Read one final answer into r (as dormantctl's outcome.c)."""
    r.status = status
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    r.body = body
    if status == 200:
        if not isinstance(body, dict):
            r.ok, r.error = False, "HTTP 200 but the body is not a JSON object"
            return
        r.ok = True
        if action in ("sleep", "wake"):
            _read_report(r, action, body)
        elif action == "stats":
            r.state = body.get("state") if isinstance(body.get("state"), str) else None
            totals = body.get("totals") or {}
            r.bytes = _bytes_of(totals, "device_bytes")
            r.host_bytes = _bytes_of(totals, "host_bytes")
            if body.get("healthy") is False:
                r.ok = False
                r.error = f"unhealthy: {body.get('health_error') or '(no reason given)'}"
        else:
            r.state = body.get("status") if isinstance(body.get("status"), str) else None
        return
    r.ok = False
    doc = body if isinstance(body, dict) else None
    r.problem = doc
    kind = text = ""
    if doc:
        t = doc.get("type")
        if isinstance(t, str) and t.startswith(PROBLEM_PREFIX):
            kind = t[len(PROBLEM_PREFIX):]
        if isinstance(doc.get("report"), dict):
            _read_report(r, action, doc["report"])
        text = doc.get("detail") or doc.get("title") or ""
        text = text if isinstance(text, str) else ""
    if kind and text:
        r.error = f"HTTP {status} {kind}: {text}"
    elif text or kind:
        r.error = f"HTTP {status}: {text or kind}"
    else:
        r.error = f"HTTP {status} ({ctype or 'no content type'})"


# ---- one attempt (blocking) --------------------------------------------------

class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class _Retryable(Exception):
    """A failure with no HTTP answer: connection-level ones are worth another
    attempt (retry=True), an oversized answer is not."""

    def __init__(self, message, sent, retry=True):
        super().__init__(message)
        self.sent = sent
        self.retry = retry


def _attempt(ep, method, path, body, headers, timeout, connect_timeout, ssl_context):
    """One request; returns (status, headers, body bytes) or raises
    _Retryable. Gives up when the server is silent for `timeout` seconds."""
    if ep.unix_path:
        conn = _UnixConnection(ep.unix_path, connect_timeout)
    elif ep.scheme == "https":
        conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=connect_timeout,
                                           context=ssl_context)
    else:
        conn = http.client.HTTPConnection(ep.host, ep.port, timeout=connect_timeout)
    sent = False
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as e:
            raise _Retryable(f"cannot connect: {_why(e)}", False) from None
        conn.sock.settimeout(timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            sent = True
            resp = conn.getresponse()
            data = resp.read(_RESPONSE_MAX + 1)
        except (OSError, http.client.HTTPException) as e:
            raise _Retryable(f"{'no answer' if sent else 'send failed'}: {_why(e)}",
                             sent) from None
        if len(data) > _RESPONSE_MAX:
            raise _Retryable(f"answer longer than {_RESPONSE_MAX} bytes", True, retry=False)
        return resp.status, resp.headers, data
    finally:
        conn.close()


def _why(e):
    if isinstance(e, socket.timeout) or isinstance(e, TimeoutError):
        return "timed out"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _retry_after(headers):
    v = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(v)) if v is not None else -1.0
    except ValueError:
        return -1.0


_C = TypeVar("_C", bound="_Common")


class _Common:
    def __init__(self, endpoints: Union[str, Iterable[str], None] = None, *,
                 dns: Union[str, Iterable[str], None] = None,
                 ports: Union[str, int, Iterable[int], None] = None,
                 family: Optional[int] = None, token: Union[str, bool, None] = None,
                 token_file: Union[str, "os.PathLike[str]", None] = None,
                 concurrency: int = 64, timeout: float = 120.0, connect_timeout: float = 5.0,
                 retries: int = 4, backoff: float = 0.5, max_delay: float = 30.0,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 raise_on_error: bool = True) -> None:
        """endpoints, dns, ports, family: see parse_endpoints(). token: the
        bearer token (else token_file, $DORMANT_TOKEN, $DORMANT_TOKEN_FILE).
        concurrency: requests in flight at most. timeout: seconds one attempt
        may wait on a silent server; connect_timeout: for the connection.
        retries: attempts after the first on a 503 or a connection error;
        backoff: the first delay, doubled each retry, with jitter, at least
        the server's Retry-After; max_delay: the cap of any one delay.
        raise_on_error: raise RankError when a rank failed (else only
        return the results). Bad arguments raise ValueError."""
        self.endpoints = parse_endpoints(endpoints, dns=dns, ports=ports, family=family)
        self._token = load_token(token, token_file)
        for name, v, lo in (("concurrency", concurrency, 1), ("retries", retries, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an integer of at least {lo}")
        for name, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"{name} must be a number of seconds above 0")
        for name, seconds in (("backoff", backoff), ("max_delay", max_delay)):
            if not isinstance(seconds, (int, float)) or not seconds >= 0:
                raise ValueError(f"{name} must be a number of seconds, 0 or more")
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.retries = retries
        self.backoff = float(backoff)
        self.max_delay = float(max_delay)
        self.ssl_context = ssl_context
        self.raise_on_error = raise_on_error
        self._random = random.Random()

    @classmethod
    def discover(cls: Type[_C], dir: Union[str, "os.PathLike[str]", None] = None,
                 role: Optional[str] = None, **kwargs: Any) -> _C:
        """A client over every live server that published a discovery record
        in runtime_dir(dir), of `role` only if given (see discover()); other
        arguments as for the constructor. Raises ValueError when there is
        none, PermissionError when the directory may not be trusted; files
        that are not records are skipped with a RecordWarning."""
        stale: List[Record] = []
        skipped: List[Tuple[str, str]] = []
        records = discover(dir, role, stale=stale, skipped=skipped)
        if not records:
            of = f" of role {role!r}" if role is not None else ""
            raise ValueError(f"no live server{of} in {runtime_dir(dir)} "
                             f"({len(stale)} stale record(s), {len(skipped)} other "
                             "file(s) skipped)")
        client = cls([r.url for r in records], **kwargs)
        client.records = records
        return client

    # the discovery records a client made by discover() is over; [] otherwise
    records: List[Record] = []

    # how a retry waits (tests replace them to see the delays)
    _sleep = staticmethod(time.sleep)
    _async_sleep = staticmethod(asyncio.sleep)

    def __repr__(self) -> str:
        names = ", ".join(e.name for e in self.endpoints[:4])
        more = f", ... ({len(self.endpoints)} in all)" if len(self.endpoints) > 4 else ""
        return f"<{type(self).__name__} {names}{more}>"

    def delay_s(self, attempt: int, retry_after_s: float) -> float:
        """The wait before retry number `attempt` (1, 2, ...), as dormantctl."""
        r = self._random.random()
        delay = self.backoff
        for _ in range(1, attempt):
            if delay >= self.max_delay:
                break
            delay *= 2
        delay *= 0.5 + 0.5 * r  # equal jitter
        if retry_after_s >= 0 and delay < retry_after_s:
            delay = retry_after_s * (1 + 0.2 * r)
        return min(delay, self.max_delay)

    @staticmethod
    def _request(action, tags, residue=None):
        if action in ("sleep", "wake"):
            if tags is not None:
                if isinstance(tags, str):
                    tags = [t for t in tags.split(",") if t]
                tags = list(tags)
                if not all(isinstance(t, str) and t for t in tags):
                    raise ValueError("tags must be non-empty strings")
            fields = {} if tags is None else {"tags": tags}
            if residue is not None:
                if action != "sleep" or residue not in ("keep", "checkpoint"):
                    raise ValueError("residue is a sleep's, 'keep' or 'checkpoint'")
                fields["residue"] = residue
            body = json.dumps(fields).encode() if fields else b""
            return "POST", f"/{action}", body
        return "GET", {"stats": "/stats", "health": "/healthz", "ready": "/readyz"}[action], None

    def _headers(self, body):
        h = {"Accept": "application/json", "Connection": "close"}
        if body:
            h["Content-Type"] = "application/json"
        if self._token:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _one(self, ep, request):
        """Generator of the retry loop: yields ('attempt', None) to have one
        attempt run (sent back: its outcome) and ('wait', seconds)."""
        method, path, body = request
        headers = self._headers(body)
        r = RankResult(ep.name)
        start = time.monotonic()
        sent_unanswered = False
        while True:
            r.attempts += 1
            outcome = yield ("attempt", (ep, method, path, body, headers))
            may_retry = r.attempts <= self.retries
            if isinstance(outcome, _Retryable):
                r.status, r.ok, r.error = None, False, str(outcome)
                sent_unanswered |= outcome.sent
                if may_retry and outcome.retry:
                    yield ("wait", self.delay_s(r.attempts, -1))
                    continue
                break
            status, hdrs, data = outcome
            _fill(r, path_action(path), status, hdrs.get("Content-Type"), data)
            if not r.ok and may_retry and (status == 503 or
                                           (status == 409 and sent_unanswered)):
                yield ("wait", self.delay_s(r.attempts, _retry_after(hdrs)))
                continue
            break
        if not r.ok and r.attempts > 1:
            r.error += f" (after {r.attempts} attempts)"
        r.elapsed_s = time.monotonic() - start
        return r

    def _finish(self, action, results):
        if self.raise_on_error and not all(r.ok for r in results):
            raise RankError(action, results)
        return results

    def _run_blocking(self, ep, request):
        gen = self._one(ep, request)
        sent = None
        try:
            while True:
                kind, arg = gen.send(sent)
                if kind == "wait":
                    self._sleep(arg)
                    sent = None
                else:
                    try:
                        sent = _attempt(*arg, self.timeout, self.connect_timeout,
                                        self.ssl_context)
                    except _Retryable as e:
                        sent = e
        except StopIteration as stop:
            return stop.value


def path_action(path: str) -> str:
    return {"/sleep": "sleep", "/wake": "wake", "/stats": "stats"}.get(path, "health")  # or ready


class Client(_Common):
    """Blocking client over many endpoints (threads, `concurrency` at once).
    See the module and _Common.__init__ for the arguments."""

    def _call(self, action, tags=None, together=False, residue=None):
        request = self._request(action, tags, residue)
        workers = len(self.endpoints) if together else min(self.concurrency, len(self.endpoints))
        with concurrent.futures.ThreadPoolExecutor(workers, "dormant-client") as pool:
            results = list(pool.map(lambda ep: self._run_blocking(ep, request),
                                    self.endpoints))
        return self._finish(action, results)

    def sleep(self, tags: Union[str, Sequence[str], None] = None, *,
              residue: Optional[str] = None) -> List[RankResult]:
        """POST /sleep on every rank (tags: a list, or None for every tag;
        residue: "checkpoint" or "keep" for this sleep, None: each rank's
        option; docs/design.md, "Residue")."""
        return self._call("sleep", tags, residue=residue)

    def wake(self, tags: Union[str, Sequence[str], None] = None) -> List[RankResult]:
        """POST /wake on every rank (tags: a list, or None for every tag)."""
        return self._call("wake", tags)

    def sleep_together(self, tags: Union[str, Sequence[str], None] = None, *,
                       residue: Optional[str] = None) -> List[RankResult]:
        """POST /sleep to every rank at once, `concurrency` notwithstanding.
        For the ranks of one job: each suspends its NCCL communicators after
        its copies, a collective that waits for every rank of the group, so
        a rank must never wait for a free slot while its peers wait for it
        (docs/orchestrators.md, "Sleeping the ranks of a job together").
        With residue "checkpoint" each rank checkpoints itself once its
        tags are asleep."""
        return self._call("sleep", tags, together=True, residue=residue)

    def wake_together(self, tags: Union[str, Sequence[str], None] = None) -> List[RankResult]:
        """POST /wake to every rank at once (resuming the communicators is
        collective too); see sleep_together()."""
        return self._call("wake", tags, together=True)

    def stats(self) -> List[RankResult]:
        """GET /stats on every rank; an unhealthy rank counts as failed."""
        return self._call("stats")

    def health(self) -> List[RankResult]:
        """GET /healthz on every rank."""
        return self._call("health")

    def ready(self) -> List[RankResult]:
        """GET /readyz on every rank (a 503 not-ready is retried as any 503)."""
        return self._call("ready")

    def close(self) -> None:
        """Nothing to release (no connection outlives a request)."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient(_Common):
    """asyncio client: the same calls as Client, as coroutines. Retry waits
    are asyncio sleeps; each attempt runs in a worker thread (at most
    `concurrency` at once), so a slow rank never blocks the event loop."""

    async def _run_async(self, ep, request, limit, pool=None):
        gen = self._one(ep, request)
        sent = None
        try:
            while True:
                kind, arg = gen.send(sent)
                if kind == "wait":
                    await self._async_sleep(arg)
                    sent = None
                    continue
                async with limit:
                    try:
                        sent = await asyncio.get_running_loop().run_in_executor(
                            pool, functools.partial(_attempt, *arg, self.timeout,
                                                    self.connect_timeout, self.ssl_context))
                    except _Retryable as e:
                        sent = e
        except StopIteration as stop:
            return stop.value

    async def _call(self, action, tags=None, together=False, residue=None):
        request = self._request(action, tags, residue)
        if not together:
            limit = asyncio.Semaphore(self.concurrency)
            results = await asyncio.gather(*(self._run_async(ep, request, limit)
                                             for ep in self.endpoints))
            return self._finish(action, list(results))
        # a thread per rank: the loop's default pool may be smaller
        limit = asyncio.Semaphore(len(self.endpoints))
        with concurrent.futures.ThreadPoolExecutor(len(self.endpoints),
                                                   "dormant-client") as pool:
            results = await asyncio.gather(*(self._run_async(ep, request, limit, pool)
                                             for ep in self.endpoints))
        return self._finish(action, list(results))

    async def sleep(self, tags: Union[str, Sequence[str], None] = None, *,
                    residue: Optional[str] = None) -> List[RankResult]:
        """POST /sleep on every rank (see Client.sleep)."""
        return await self._call("sleep", tags, residue=residue)

    async def wake(self, tags: Union[str, Sequence[str], None] = None) -> List[RankResult]:
        """POST /wake on every rank."""
        return await self._call("wake", tags)

    async def sleep_together(self, tags: Union[str, Sequence[str], None] = None, *,
                             residue: Optional[str] = None) -> List[RankResult]:
        """POST /sleep to every rank at once (see Client.sleep_together)."""
        return await self._call("sleep", tags, together=True, residue=residue)

    async def wake_together(self, tags: Union[str, Sequence[str], None] = None) -> List[RankResult]:
        """POST /wake to every rank at once (see Client.wake_together)."""
        return await self._call("wake", tags, together=True)

    async def stats(self) -> List[RankResult]:
        """GET /stats on every rank; an unhealthy rank counts as failed."""
        return await self._call("stats")

    async def health(self) -> List[RankResult]:
        """GET /healthz on every rank."""
        return await self._call("health")

    async def ready(self) -> List[RankResult]:
        """GET /readyz on every rank."""
        return await self._call("ready")

    async def aclose(self) -> None:
        """Nothing to release (no connection outlives a request)."""

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

