# SPDX-License-Identifier: MIT
"""A real `dormantd --backend host` for the Python test suites (ctl, deploy,
http): started on 127.0.0.1 (a free port, read from --port-file) or on a Unix
socket, its output kept in a log file, stopped with SIGTERM."""
import os
import pathlib
import signal
import socket
import subprocess
import time

START_TIMEOUT_S = 20


class Dormantd:
    def __init__(self, binary, tmp, name, *extra, unix=False, keep="8MiB", discard="8MiB",
                 env=None):
        tmp = pathlib.Path(tmp)
        self.port_file = tmp / f"{name}.port"
        self.unix_path = str(tmp / f"{name}.sock") if unix else None
        self.log = open(tmp / f"{name}.log", "w+")
        args = [binary, "--backend", "host", "--keep", keep, "--discard", discard, "--quiet"]
        if unix:
            args += ["--unix", self.unix_path]
        else:
            args += ["--listen", "127.0.0.1:0", "--port-file", str(self.port_file)]
        args += list(extra)
        # only what the test passes may configure the daemon
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("DORMANT_TOKEN", "DORMANT_TOKEN_FILE")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=full_env)
        self.port = None
        self._wait_listening()

    def _wait_listening(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dormantd exited ({self.proc.returncode}): {self.output()}")
            if self.unix_path:
                # the path exists from bind(); connect() works from listen()
                if os.path.exists(self.unix_path) and self._unix_accepts():
                    return
            elif self.port_file.exists():
                text = self.port_file.read_text().strip()
                if text:
                    self.port = int(text)
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("dormantd did not start listening")

    def _unix_accepts(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.unix_path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def output(self):
        """Everything dormantd printed so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    @property
    def endpoint(self):
        return f"unix:{self.unix_path}" if self.unix_path else f"127.0.0.1:{self.port}"

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s=10):
        """SIGTERM, then SIGKILL after timeout_s; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode
