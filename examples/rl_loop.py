#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""An RL loop: a trainer whose GPU memory an orchestrator puts to sleep for
each rollout phase and wakes for each train phase, over HTTP only.

The trainer serves dormant's HTTP API and trains continuously, each step
inside dormant.step(): a /sleep waits for the running step to end, and the
next step waits for the /wake. It reports its progress in GET /stats under
"extra". The orchestrator reaches it over HTTP only, through dormant.client
(standard library only; it never loads libdormant):

  repeat:  train phase: let the trainer do --steps-per-phase steps
           rollout:     POST /sleep  (the GPU is free for a rollout engine)
                        ... generate ...
                        POST /wake   (the client retries it while it answers
                                      503, honouring Retry-After)

Run both in one process (the orchestrator on a thread):
  PYTHONPATH=python DORMANT_LIB=build/libdormant.so python3 examples/rl_loop.py
or as two processes:
  python3 examples/rl_loop.py --role trainer --port 8787 &
  python3 examples/rl_loop.py --role orchestrator --url http://127.0.0.1:8787
With torch and a GPU the trainer is examples/megatron_style.py's; --simulate
(the default without a GPU) trains a stand-in on dormant's simulated device
(no torch needed), checking after every wake that its kept weights came back.
"""
import argparse
import pathlib
import struct
import sys
import threading
import time

MiB = 1 << 20


# ---- the orchestrator: HTTP only ------------------------------------------

def trainer_steps(trainer):
    stats = trainer.stats()[0].body  # raises dormant.client.RankError on failure
    return stats.get("extra", {}).get("steps", 0), stats


def orchestrate(url, cycles, steps_per_phase, rollout_s, log=print):
    """Alternate train and rollout phases; returns the number of cycles run."""
    client = import_dormant_client()
    # one rank here; a real job lists every rank's URL (or dns=, see
    # docs/orchestrators.md). A wake that answers 503 is retried for a while.
    trainer = client.Client([url], timeout=600, retries=60, max_delay=5)
    for cycle in range(1, cycles + 1):
        start, _ = trainer_steps(trainer)
        deadline = time.monotonic() + 600
        while True:
            steps, stats = trainer_steps(trainer)
            if steps >= start + steps_per_phase:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the trainer makes no progress")
            time.sleep(0.05)
        loss = stats.get("extra", {}).get("loss")
        log(f"[orchestrator] cycle {cycle}: train phase done, trainer at step {steps}"
            + (f", loss {loss:.4f}" if isinstance(loss, float) else ""))

        rep = trainer.sleep()[0].body
        _, stats = trainer_steps(trainer)
        gpu = stats["devices"][0] if stats.get("devices") else {}
        log(f"[orchestrator] cycle {cycle}: rollout phase: /sleep took {rep['duration_s']:.3f} s "
            f"(waited {rep['guard_wait_s'] * 1e3:.1f} ms for the step), "
            f"{rep['bytes_released'] / MiB:.1f} MiB released, "
            f"{rep['bytes_copied'] / MiB:.1f} MiB kept in host memory; "
            f"device free {gpu.get('free_bytes', 0) / MiB:.0f} MiB")
        time.sleep(rollout_s)  # a rollout engine would generate here

        woken = trainer.wake()[0]
        if woken.attempts > 1:
            log(f"[orchestrator] /wake answered 503 {woken.attempts - 1} time(s) first")
        rep = woken.body
        log(f"[orchestrator] cycle {cycle}: /wake took {rep['duration_s']:.3f} s, "
            f"{rep['bytes_mapped'] / MiB:.1f} MiB mapped, {rep['bytes_zeroed'] / MiB:.1f} MiB "
            f"of grads zero-filled")
    return cycles


# ---- trainers ---------------------------------------------------------------

def import_dormant_client():
    try:
        import dormant.client
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
        import dormant.client
    return dormant.client


def import_dormant():
    try:
        import dormant
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
        import dormant
    return dormant


class SimulatedTrainer:
    """A stand-in trainer on dormant's simulated device (no torch, no GPU):
    "weights" (keep) hold the step count, "grads" (discard) scratch. Every
    step checks that the weights hold the step count it left there."""

    def __init__(self, dm, weights_bytes=8 * MiB, grads_bytes=16 * MiB):
        self.dm = dm
        dm.set_policy("weights", "keep")
        dm.set_policy("grads", "discard")
        self.weights = dm.alloc("weights", weights_bytes)
        self.grads = dm.alloc("grads", grads_bytes)
        self.size = weights_bytes
        self.steps_done = 0
        self.loss = 1.0
        dm.copy_to_device(self.weights, self._pattern(0))

    def _pattern(self, step):
        return struct.pack("<Q", step) * (self.size // 8)

    def train_step(self):
        if self.dm.copy_to_host(self.weights, self.size) != self._pattern(self.steps_done):
            raise RuntimeError(f"weights lost at step {self.steps_done}")
        self.dm.copy_to_device(self.grads, b"\x01" * 4096)  # "gradients"
        self.steps_done += 1
        self.dm.copy_to_device(self.weights, self._pattern(self.steps_done))
        self.loss *= 0.9
        return self.loss


class TorchTrainer:
    """examples/megatron_style.py's trainer."""

    def __init__(self, dm, args):
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        from megatron_style import Config, Trainer, deterministic
        deterministic()
        self.trainer = Trainer(Config(d_model=args.d_model, n_layers=args.layers,
                                      d_ff=4 * args.d_model), manager=dm)
        self.batches = self._forever()
        self.steps_done = 0
        self.loss = None

    def _forever(self):
        seed = 0
        while True:
            yield from self.trainer.batches(100, seed=seed)
            seed += 1

    def train_step(self):
        x, y = next(self.batches)
        self.loss = self.trainer.train_step(x, y).item()
        self.steps_done += 1
        return self.loss


def make_trainer(args):
    dormant = import_dormant()
    if args.simulate:
        dormant.configure(backend="host")
        return dormant, SimulatedTrainer(dormant.manager())
    dormant.configure(backend="cuda")
    return dormant, TorchTrainer(dormant.manager(), args)


def run_trainer(dormant, trainer, stop, max_steps, log=print):
    """Train until stop is set or max_steps are done; each step in the guard."""
    while not stop.is_set() and (max_steps is None or trainer.steps_done < max_steps):
        try:
            with dormant.step(timeout_s=0.5):
                loss = trainer.train_step()
        except dormant.StepTimeoutError:
            continue  # asleep: look at stop, then wait again
        if trainer.steps_done % 10 == 0:
            log(f"[trainer] step {trainer.steps_done} loss {loss:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["both", "trainer", "orchestrator"], default="both")
    ap.add_argument("--url", help="the trainer's URL (--role orchestrator)")
    ap.add_argument("--port", type=int, default=0, help="the trainer's port (0: any free one)")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--steps-per-phase", type=int, default=5)
    ap.add_argument("--rollout-s", type=float, default=0.2)
    ap.add_argument("--max-steps", type=int, default=None, help="--role trainer: stop after")
    ap.add_argument("--simulate", action="store_true",
                    help="no torch: a stand-in trainer on the simulated device")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()

    if args.role == "orchestrator":
        if not args.url:
            ap.error("--role orchestrator needs --url")
        orchestrate(args.url.rstrip("/"), args.cycles, args.steps_per_phase, args.rollout_s)
        return

    if not args.simulate:
        try:
            import torch
            args.simulate = not torch.cuda.is_available()
        except ImportError:
            args.simulate = True
        if args.simulate:
            print("[trainer] no torch with CUDA here: using the simulated trainer (--simulate)")
    dormant, trainer = make_trainer(args)
    server = dormant.serve(port=args.port, quiet=True, stats_extra=lambda: {
        "steps": trainer.steps_done, "loss": trainer.loss})
    print(f"[trainer] serving {server.url}", flush=True)
    stop = threading.Event()

    if args.role == "trainer":
        try:
            run_trainer(dormant, trainer, stop, args.max_steps)
        except KeyboardInterrupt:
            pass
        server.stop()
        return

    t = threading.Thread(target=run_trainer, args=(dormant, trainer, stop, None), daemon=True)
    t.start()
    failed = None
    try:
        cycles = orchestrate(server.url, args.cycles, args.steps_per_phase, args.rollout_s)
    except Exception as e:
        failed = e
    stop.set()
    t.join(600)
    server.stop()
    if failed or t.is_alive():
        sys.exit(f"rl_loop failed: {failed or 'the trainer did not stop'}")
    print(f"done: {cycles} rollout/train cycles, {trainer.steps_done} training steps, "
          f"{dormant.stats()['counters']['sleeps_ok']} sleeps")


if __name__ == "__main__":
    main()
