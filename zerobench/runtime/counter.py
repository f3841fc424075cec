"""Live storage bytes by category, counted op by op: the trace's memory (runtime/trace.py, under
fake tensors) and the emulated rank's tensor bytes (runtime/emulate.py, real tensors) are counted
by the same code, so the two can be held equal byte for byte.

Each storage is booked against the device it lives on: the peak and its breakdown are the compute
device's alone; what lives on the host (P_a+cpu's offloaded checkpoints, paper §6.1) is `host`, a
figure of its own with its own peak (`host_peak`). A storage is on the host when it is on another
device than the counter's, or when the engine allocates it for the host (`booking("host")`): a
trace builds every fake tensor on one fake device, and an emulated CPU rank stands for a GPU rank
whose host is apart.

Not `torch.distributed._tools.mem_tracker.MemTracker`: MemTracker recognises only nn.Parameter
storages, `torch.optim` states and `.grad` tensors, while this engine keeps its states in flat
buffers of its own (it would file gradients and optimizer states as "other" and stage 3's gathered
parameters as activations), and it grows super-linearly with the tensors tracked (docs/design.md).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from functools import partial

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("param", "grad", "optimizer", "activation", "temporary", "other", "host")
HOST = "host"  # the one category not on the compute device
_DEVICE = torch.ops.prim.device.default  # the argument parser asks for it more than once per op


class _Counting:
    """Counts live bytes per category of every storage the ops create while the mode is active,
    and the peak with its breakdown. A new storage takes the category of the current `phase`;
    `tag` files tensors under a category of their own (the engine's model states), and `retag`,
    called on the op after each allocation, lists the short-lived tensors that are model states
    although the step creates them (stage 2's gradient staging buckets, stage 3's gathered
    parameter buckets)."""

    def _start_counting(self, retag, device_type: str) -> None:
        self.phase = "other"
        self.retag = retag
        self.device_type = device_type  # the compute device's type: a storage elsewhere is the host's
        self._live: dict[int, list] = {}  # id(storage) -> [weakref, bytes, category]
        self.bytes = dict.fromkeys(CATEGORIES, 0)  # live now
        self.high = dict.fromkeys(CATEGORIES, 0)  # each category's own high-water mark
        self.total = 0  # on the compute device (every category but the host's)
        self._fresh = False
        self.reset_peak()

    def reset_peak(self) -> None:
        """The device's peak and breakdown restart from now, and the host's peak too."""
        self._device_peak()
        self.host_peak = self.bytes[HOST]

    def _device_peak(self) -> None:
        """The device's peak is now: its bytes and breakdown (the host's peak keeps its own high)."""
        self.peak = self.total
        self.peak_bytes = {k: v for k, v in self.bytes.items() if k != HOST}

    @contextmanager
    def booking(self, category: str):
        """Storages made inside are booked under `category` (the engine's host allocations)."""
        phase, self.phase = self.phase, category
        try:
            yield
        finally:
            self.phase = phase

    def reset_high(self) -> None:
        self.high = dict(self.bytes)

    def tag(self, tensors, category: str) -> None:
        for t in tensors:
            self._see(t, category, force=True)

    def _counted(self, out) -> None:
        """Book what one op (outermost) returned."""
        if self._fresh:  # a buffer the engine allocated at the last op may be a model state
            self._fresh = False
            for t, category in self.retag():
                self._see(t, category, force=True)
        for t in tree_leaves(out):
            # a meta tensor (the model before the engine builds it) is a shape, not memory
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and (kind := self._device_type(t)) != "meta":
                self._see(t, self.phase if kind == self.device_type else HOST)
        if self.total >= self.peak:  # >=: what the last op allocated was retagged by this one
            self._device_peak()

    def _see(self, t: torch.Tensor, category: str, force: bool = False) -> None:
        st = t.untyped_storage()
        entry = self._live.get(id(st))
        if entry is None:
            n = st.nbytes()
            self._live[id(st)] = [weakref.ref(st, partial(self._free, id(st))), n, category]
            self._add(category, n)
            self._fresh = True
        elif force and entry[2] != category:
            self._add(entry[2], -entry[1])
            self._add(category, entry[1])
            entry[2] = category

    def _add(self, category: str, n: int) -> None:
        self.bytes[category] += n
        self.high[category] = max(self.high[category], self.bytes[category])
        if category == HOST:
            self.host_peak = max(self.host_peak, self.bytes[HOST])
        else:
            self.total += n

    def _free(self, key: int, _ref) -> None:
        _, n, category = self._live.pop(key)
        self._add(category, -n)


class StorageCounter(_Counting, FakeTensorMode):
    """FakeTensorMode that counts (`_Counting`): nothing is allocated, any scale traces.

    One mode, not a TorchDispatchMode stacked on FakeTensorMode: each op crosses into Python once,
    not twice, and the `prim.device` queries (more than the ops) are answered here directly. Ops
    that FakeTensorMode runs inside another (decompositions) are not counted, as a mode stacked
    above it would not see them.

    `nn.Module.to` works in it: the converter's memo of fresh op outputs would put a weakref on
    every Parameter, and `Module._apply` then refuses to swap fake parameters (pytorch#178584); a
    fresh meta tensor is never looked up again, so nothing is lost by not memoizing."""

    def __init__(self, retag=lambda: (), device_type: str = "cpu"):
        super().__init__()
        self.fake_tensor_converter.set_tensor_memo = lambda t, v: None
        self._depth = 0  # ops under way: FakeTensorMode re-enters itself to decompose
        self._start_counting(retag, device_type)

    @staticmethod
    def _device_type(t: torch.Tensor) -> str:
        return t.fake_device.type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # answered as FakeTensorMode's own handler does, without its dispatch
            return torch.device("meta") if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        self._depth += 1
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs or {})
        finally:
            self._depth -= 1
        if not self._depth:
            self._counted(out)
        return out


class LiveCounter(_Counting, TorchDispatchMode):
    """The same count over real tensors (`_Counting`): every op runs, on its real device. Each op
    crosses into Python once, so a step under it runs slower: time steps outside it."""

    def __init__(self, retag=lambda: (), device_type: str = "cpu"):
        super().__init__()
        self._start_counting(retag, device_type)

    @staticmethod
    def _device_type(t: torch.Tensor) -> str:
        return t.device.type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._counted(out)
        return out
