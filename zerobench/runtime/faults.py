"""Faults on purpose, and a watchdog so that a trial with a dead or stuck rank still ends.

`ZEROBENCH_FAULT="rank=1,step=2,kind=exit"` makes rank 1 die at the start of step 2 (`exit`: no
clean-up, as a crash; `hang`: sleep forever, as a stuck rank or collective; `raise`: a Python
exception). The reliability tests run `zerobench run` with it and check that the record says
`error` or `timeout` and that no rank outlives the trial.

The watchdog ends a rank that makes no progress (no new step begun) for `timeout_s` seconds. It
does not rely on the process groups' own timeouts, which a stuck rank outside a collective, or a
group created without a timeout, would never reach. It calls `on_expire(step)` (rank 0 writes
the `timeout` record there) and exits with `WATCHDOG_EXIT`; the launcher sees a failed rank and
stops the others.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from zerobench.engine.config import ConfigError

ENV = "ZEROBENCH_FAULT"
KINDS = ("exit", "hang", "raise")
FAULT_EXIT = 17  # exit status of a rank killed by an injected `exit`
WATCHDOG_EXIT = 124  # exit status of a rank ended by its watchdog, as timeout(1) uses
RANK0_GRACE_S = 2.0  # other ranks wait this long so that rank 0 writes the record first


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str


@lru_cache(maxsize=8)
def parse(text: str) -> Fault | None:
    """`rank=R,step=S,kind=K` as a Fault; empty text is no fault. Errors name the field."""
    if not text.strip():
        return None
    fields = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in ("rank", "step", "kind"):
            raise ConfigError(f"{ENV}={text!r}: expected rank=R,step=S,kind=K; got {part.strip()!r}")
        fields[key] = value.strip()
    for key in ("rank", "step"):
        if not fields.get(key, "").isdigit():
            raise ConfigError(f"{ENV} {key}={fields.get(key)!r}: must be an integer >= 0")
    kind = fields.get("kind", "exit")
    if kind not in KINDS:
        raise ConfigError(f"{ENV} kind={kind!r}: must be one of {list(KINDS)}")
    return Fault(int(fields["rank"]), int(fields["step"]), kind)


_watchdog: _Watchdog | None = None


def at_step(step: int, rank: int) -> None:
    """Mark the start of `step` on this rank: the watchdog sees progress, and the fault in
    $ZEROBENCH_FAULT fires if it is this rank's and this step's."""
    if _watchdog is not None:
        _watchdog.kick(step)
    fault = parse(os.environ.get(ENV, ""))
    if fault is None or (fault.rank, fault.step) != (rank, step):
        return
    print(f"zerobench: injected fault on rank {rank} at step {step}: {fault.kind}", file=sys.stderr, flush=True)
    if fault.kind == "exit":
        os._exit(FAULT_EXIT)
    if fault.kind == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected fault: rank {rank} raised at step {step}")


class _Watchdog:
    def __init__(self, timeout_s: float, rank: int, on_expire):
        self.timeout_s, self.rank, self.on_expire = timeout_s, rank, on_expire
        self.step = -1  # no step begun yet: building the engine counts against the first deadline
        self.deadline = time.monotonic() + timeout_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="zerobench-watchdog", daemon=True)
        self.thread.start()

    def kick(self, step: int) -> None:
        self.step, self.deadline = step, time.monotonic() + self.timeout_s

    def _watch(self) -> None:
        while not self.stopped.wait(min(1.0, self.timeout_s / 4)):
            if time.monotonic() < self.deadline:
                continue
            print(
                f"zerobench: rank {self.rank} made no progress for {self.timeout_s:g} s (step {self.step}); ending it",
                file=sys.stderr,
                flush=True,
            )
            try:
                if self.rank == 0:
                    self.on_expire(self.step)
                else:
                    time.sleep(RANK0_GRACE_S)
            finally:
                os._exit(WATCHDOG_EXIT)


@contextmanager
def watchdog(timeout_s: float, rank: int, on_expire):
    """Watch this process's training steps for the duration of the block."""
    global _watchdog
    _watchdog = _Watchdog(timeout_s, rank, on_expire)
    try:
        yield _watchdog
    finally:
        _watchdog.stopped.set()
        _watchdog = None
