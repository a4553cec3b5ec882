# SPDX-License-Identifier: MIT
"""Residue mode checkpoint on the GPU (issue 34): one trainer-like process per
scenario, that it ends cleanly asleep or awake, and what the checkpoint gives
back. Run by scripts/gpu-residue; prints one line per scenario (and FAIL with
the child's last output where one did not end as it should); exits 1 then:

  python3 tests/gpu/residue_exit.py child SCENARIO   (one process)
  python3 tests/gpu/residue_exit.py                  (every scenario, each in a
                                                      child with a time limit)

Scenarios: exit-asleep (sys.exit while checkpointed), exit-awake (after a
restore), sigterm-asleep, sigkill-asleep (killed while checkpointed, after a
restore and a second checkpoint), graph (a CUDA graph captured before the
sleep replays after the wake), cublas (a matmul after the restore).
"""
import json
import os
import signal
import subprocess
import sys
import time


def smi_mib(pid):
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20).stdout
    except Exception:
        return None
    for line in out.splitlines():
        p, _, mib = line.partition(",")
        if p.strip() == str(pid):
            return int(mib)
    return 0


def child(scenario):
    import faulthandler
    faulthandler.enable()   # a crash at exit says where
    import torch
    import dormant
    m = dormant.Manager(residue="checkpoint")
    with m.region("weights", "keep"):
        w = torch.randn(64 << 20, device="cuda")            # 256 MiB kept
    with m.region("grads", "discard"):
        g = torch.ones(64 << 20, device="cuda")
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()                                   # cuBLAS up
    graph = None
    if scenario == "graph":
        static_in = torch.randn(1 << 20, device="cuda")
        with m.region("weights"):
            static_out = torch.empty_like(static_in)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            static_out.copy_(static_in * 2)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out.copy_(static_in * 2)
    before = w.sum().item()
    torch.cuda.synchronize()
    awake = smi_mib(os.getpid())
    t0 = time.monotonic()
    rep = m.sleep()
    t_sleep = time.monotonic() - t0
    st = m.stats()["residue"]
    asleep = smi_mib(os.getpid())
    line = {"scenario": scenario, "awake_mib": awake, "asleep_mib": asleep,
            "sleep_s": round(t_sleep, 3), "residue": st["state"],
            "residue_bytes": st["residue_bytes"], "checkpoint_s": st["last"]["seconds"],
            "error": st["last"]["error"], "report_residue": rep.get("residue")}
    if scenario in ("exit-asleep", "sigterm-asleep"):
        print("RESULT " + json.dumps(line), flush=True)
        if scenario == "sigterm-asleep":
            print("READY", flush=True)
            time.sleep(120)
        sys.exit(0)
    t0 = time.monotonic()
    m.wake()
    line["wake_s"] = round(time.monotonic() - t0, 3)
    line["restore_s"] = m.stats()["residue"]["last"]["seconds"]
    line["kept_ok"] = abs(w.sum().item() - before) < 1e-3 * max(1.0, abs(before))
    line["grads_zero"] = g.abs().sum().item() == 0
    line["matmul_ok"] = bool(torch.isfinite((a @ a).sum()).item())
    if graph is not None:
        static_in.fill_(3)
        graph.replay()
        torch.cuda.synchronize()
        line["graph_ok"] = bool((static_out == 6).all().item())
    line["calls_while_checkpointed"] = m.stats()["residue"]["calls_while_checkpointed"]
    if scenario == "sigkill-asleep":
        m.sleep()
        line["asleep_again"] = m.stats()["residue"]["state"]
        print("RESULT " + json.dumps(line), flush=True)
        print("READY", flush=True)
        time.sleep(120)
    print("RESULT " + json.dumps(line), flush=True)
    sys.exit(0)


def run(scenario):
    import threading
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, __file__, "child", scenario], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out, found = [], {}

    def read():
        for line in p.stdout:
            out.append(line)
            if line.startswith("RESULT "):
                found["result"] = json.loads(line[7:])
            if line.startswith("READY"):
                p.send_signal(signal.SIGTERM if scenario == "sigterm-asleep" else signal.SIGKILL)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "TIMEOUT (the process did not end in 60 s; killed)"
    reader.join(timeout=5)
    end_s = round(time.monotonic() - t0, 1)
    time.sleep(1)
    left = smi_mib(p.pid)
    result = found.get("result")
    print(f"{scenario}: rc {rc} in {end_s} s; GPU MiB left after it ended {left}; "
          f"{json.dumps(result)}", flush=True)
    want_rc = {"sigterm-asleep": -signal.SIGTERM, "sigkill-asleep": -signal.SIGKILL}.get(scenario, 0)
    wrong = []
    if rc != want_rc:
        wrong.append(f"rc {rc}, not {want_rc}")
    if left:
        wrong.append(f"{left} MiB still held after it ended")
    if result is None:
        wrong.append("no result")
    else:
        if result.get("residue") != "checkpointed":
            wrong.append(f"residue {result.get('residue')} asleep: {result.get('error')}")
        for k in ("kept_ok", "grads_zero", "matmul_ok", "graph_ok"):
            if k in result and result[k] is not True:
                wrong.append(f"{k} false")
        if result.get("calls_while_checkpointed"):
            wrong.append("calls reached the device while checkpointed")
    if wrong:
        print(f"FAIL {scenario}: " + "; ".join(wrong), flush=True)
        print("".join(out[-40:]), flush=True)
    return not wrong


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        ok = True
        for s in sys.argv[1:] or ["graph", "exit-awake", "exit-asleep", "sigterm-asleep",
                                  "sigkill-asleep"]:
            ok = run(s) and ok
        sys.exit(0 if ok else 1)
