"""The ledger's seconds (parallel/comms.py, zerobench/clock.py's marks) on CPU: CUDA's timing events
on a simulated stream (device time advances as work is queued; the host never waits), so what a
call is charged is exact; and the engine's ledger with its seconds read from deferred events is the
host clock's, call by call. The collectives' names (torch 2.13's, no FutureWarning) and the groups
topology.build makes (WORLD wherever a group is the whole world)."""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.engine_cases import spec_for
from tests.worlds import threaded
from zerobench.clock import EventMarks, HostMarks
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms, Ledger
from zerobench.engine.parallel.topology import Group
from zerobench.runtime.trace import fake_world, trace_step
from zerobench.runtime.train import build_engine, train_steps

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
COMPUTE, TRANSFER = 0.2, 0.05  # seconds of simulated device work: queued compute, a collective


class Stream:
    """A CUDA device's current stream, simulated: `now` is the device time at which the work queued
    so far ends, `ran` the time up to which it has run (the device behind the host); `queue(s)` adds
    s seconds of work and returns at once, as a kernel launch does. `waits`: the host's waits."""

    def __init__(self):
        self.now, self.ran, self.waits = 0.0, 0.0, 0

    def queue(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self, device: torch.device) -> Stream:  # EventMarks' `stream` seam
        assert device == CUDA
        return self


class Event:
    """torch.cuda.Event on the simulated stream: stamped with the stream's `now` when recorded;
    done once the stream has run that far; `synchronize` makes the host wait for it."""

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self, stream: Stream) -> None:
        self.stream, self.at = stream, stream.now

    def query(self) -> bool:
        return self.at <= self.stream.ran

    def synchronize(self) -> None:
        if not self.query():
            self.stream.waits += 1
            self.stream.ran = self.at

    def elapsed_time(self, end: Event) -> float:
        return (end.at - self.at) * 1e3  # ms, as CUDA's


class Work:
    """An asynchronous NCCL collective: it starts when the stream reaches its issue and takes
    TRANSFER on its own stream; `wait()` makes the current stream wait for it, not the host."""

    def __init__(self, stream: Stream):
        self.stream, self.done = stream, stream.now + TRANSFER

    def wait(self) -> None:
        self.stream.now = max(self.stream.now, self.done)


def _simulated(monkeypatch) -> tuple[Stream, Comms]:
    stream = Stream()

    def all_reduce(t, op, group, async_op):
        work = Work(stream)
        if async_op:
            return work
        work.wait()  # torch's synchronous call: the current stream waits for it
        return None

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return stream, Comms(marks=EventMarks(event=Event, stream=stream))


def _cuda_tensor(numel: int = 1024) -> SimpleNamespace:
    return SimpleNamespace(device=CUDA, is_cuda=True, numel=lambda: numel, element_size=lambda: 4)


def test_events_time_a_call_from_the_work_before_it_to_its_end(monkeypatch):
    stream, comms = _simulated(monkeypatch)
    stream.queue(COMPUTE)  # the backward before the call: not charged to it
    comms.all_reduce(_cuda_tensor(), Group("dp", 2, 0))
    assert stream.waits == 0 and len(comms.ledger._pending) == 1  # the host ran ahead
    entry = comms.ledger.entries[("all_reduce", "dp")]
    assert stream.waits == 1  # reading the ledger waited for the call's end
    assert entry.seconds == pytest.approx(TRANSFER)
    assert (entry.calls, entry.bytes, entry.volume_bytes) == (1, 4096, 4096.0)  # 2N(n-1)/n at n = 2


@pytest.mark.parametrize("compute", [COMPUTE, TRANSFER / 5])
def test_an_async_call_is_charged_the_wait_beyond_the_overlapped_compute(monkeypatch, compute):
    stream, comms = _simulated(monkeypatch)
    handle = comms.all_reduce(_cuda_tensor(), Group("dp", 2, 0), async_op=True)
    stream.queue(compute)  # compute overlapping the collective
    handle.wait()
    assert len(comms.ledger._pending) == 1
    stream.ran = stream.now  # the step has run (its loss read): the ledger is read without a wait
    assert comms.ledger.entries[("all_reduce", "dp")].seconds == pytest.approx(max(0.0, TRANSFER - compute))
    assert stream.waits == 0


@pytest.mark.parametrize("op", ["copy_to_host", "copy_to_device"])
def test_host_copies_are_timed_on_the_device_side_stream(op):
    stream = Stream()
    comms = Comms(marks=EventMarks(event=Event, stream=stream))
    queue = {"copy_": lambda src: stream.queue(TRANSFER)}
    host = SimpleNamespace(device=CUDA, is_cuda=False, numel=lambda: 256, element_size=lambda: 2, **queue)
    device = SimpleNamespace(**{**vars(_cuda_tensor(256)), **queue})
    dst, src = (host, device) if op == "copy_to_host" else (device, host)
    comms.copy(dst, src, op)
    entry = comms.ledger.entries[(op, "host")]
    assert entry.seconds == pytest.approx(TRANSFER) and entry.bytes == 256 * src.element_size()


class Deferred(HostMarks):
    """Host marks whose end is never ready until the ledger is read: every call's seconds are
    deferred, as a CUDA event's are while the stream runs behind the host."""

    def ready(self, end) -> bool:
        return False


class Recording(Ledger):
    """A ledger that keeps every call (op, group, elements, bytes per element) and every charge
    (the entry's op and group, the seconds), in order."""

    def __init__(self):
        super().__init__()
        self.calls, self.charges = [], []

    def record(self, op, group, numel, elem_bytes, group_size):
        self.calls.append((op, group, numel, elem_bytes))
        return super().record(op, group, numel, elem_bytes, group_size)

    def charge(self, entry, marks, start, end):
        self.charges.append(next(k for k, e in self._entries.items() if e is entry))
        super().charge(entry, marks, start, end)


def _ledgers(rank: int, spec) -> dict:
    """The same steps with the host clock's marks and with deferred marks, on a fresh engine each."""
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    out = {}
    for name, marks in (("host", None), ("deferred", Deferred())):
        comms = Comms(Recording(), marks)
        engine = build_engine(spec, ctx, comms, torch.device("cpu"))
        train_steps(engine, spec, ctx, spec.train.steps)
        ledger = comms.ledger
        pending = len(ledger._pending)
        out[name] = dict(calls=ledger.calls, charges=ledger.charges, entries=ledger.as_dict(), pending=pending,
                         left=len(ledger._pending))  # fmt: skip
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_deferred_seconds_leave_the_ledger_unchanged_call_by_call(stage):
    for r in threaded(2, _ledgers, spec_for("tiny", dp=2, stage=stage, steps=2)):
        host, deferred = r["host"], r["deferred"]
        assert host["calls"] == deferred["calls"] and len(host["calls"]) > 10
        assert host["charges"] == deferred["charges"]  # each call charged once, in the same order
        assert host["pending"] == 0 and deferred["pending"] == len(deferred["charges"]) and deferred["left"] == 0
        strip = {k: {**v, "seconds": None} for k, v in host["entries"].items()}
        assert strip == {k: {**v, "seconds": None} for k, v in deferred["entries"].items()}
        assert all(v["seconds"] > 0 for v in deferred["entries"].values())


def test_a_reset_drops_the_seconds_not_yet_read():
    ledger, marks = Ledger(), Deferred()
    ledger.charge(ledger.record("all_reduce", "dp", 4, 4, 2), marks, 0.0, 1.0)
    ledger.reset()
    ledger.charge(ledger.record("all_reduce", "dp", 4, 4, 2), marks, 0.0, 2.0)
    assert ledger.as_dict()["all_reduce/dp"]["seconds"] == 2.0


def test_cpu_tensors_are_timed_on_the_host_clock_at_once(monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", lambda t, op, group, async_op: time.sleep(0.01))
    comms = Comms()
    comms.all_reduce(torch.ones(8), Group("dp", 2, 0))
    assert not comms.ledger._pending and comms.ledger._entries[("all_reduce", "dp")].seconds >= 0.01


def test_a_traced_step_warns_of_no_deprecated_collective():
    """Under the fake process group every reduce-scatter and all-gather is torch's own (no gloo
    pairwise path): stage 3 issues both kinds."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = trace_step(spec_for("tiny", dp=4, stage=3, steps=1))
    assert {"reduce_scatter/dp", "all_gather/dp"} <= out["ledger"].keys()
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def _groups(rank: int, dp: int, mp: int) -> dict:
    ctx = topology.build(dp, mp)
    world = dist.group.WORLD
    return {name: (g.size, g.pg is world) for name, g in (("dp", ctx.dp), ("mp", ctx.mp), ("world", ctx.world))}


@pytest.mark.parametrize(
    ("dp", "mp", "expected"),
    [
        (4, 1, {"dp": (4, True), "mp": (1, False), "world": (4, True)}),  # one communicator at mp 1
        (1, 4, {"dp": (1, False), "mp": (4, True), "world": (4, True)}),
        (2, 2, {"dp": (2, False), "mp": (2, False), "world": (4, True)}),
    ],
)
def test_a_group_of_the_whole_world_is_world(dp, mp, expected):
    assert threaded(4, _groups, dp, mp) == [expected] * 4


def test_fake_world_groups_too():
    with fake_world(8):
        ctx = topology.build(8, 1)
        assert ctx.dp.pg is dist.group.WORLD and ctx.dp.name == "dp"
