"""Live storage bytes by category, counted op by op: the trace's memory (runtime/trace.py, under
fake tensors) and the emulated rank's tensor bytes (runtime/emulate.py, real tensors) are counted
by the same code, so the two can be held equal byte for byte.

Not `torch.distributed._tools.mem_tracker.MemTracker`: MemTracker recognises only nn.Parameter
storages, `torch.optim` states and `.grad` tensors, while this engine keeps its states in flat
buffers of its own (it would file gradients and optimizer states as "other" and stage 3's gathered
parameters as activations), and it grows super-linearly with the tensors tracked (design.md).
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("param", "grad", "optimizer", "activation", "temporary", "other")
_DEVICE = torch.ops.prim.device.default  # the argument parser asks for it more than once per op


class _Counting:
    """Counts live bytes per category of every storage the ops create while the mode is active,
    and the peak with its breakdown. A new storage takes the category of the current `phase`;
    `tag` files tensors under a category of their own (the engine's model states), and `retag`,
    called on the op after each allocation, lists the short-lived tensors that are model states
    although the step creates them (stage 2's gradient staging buckets, stage 3's gathered
    parameter buckets)."""

    def _start_counting(self, retag) -> None:
        self.phase = "other"
        self.retag = retag
        self._live: dict[int, list] = {}  # id(storage) -> [weakref, bytes, category]
        self.bytes = dict.fromkeys(CATEGORIES, 0)  # live now
        self.high = dict.fromkeys(CATEGORIES, 0)  # each category's own high-water mark
        self.total = 0
        self._fresh = False
        self.reset_peak()

    def reset_peak(self) -> None:
        self.peak, self.peak_bytes = self.total, dict(self.bytes)

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
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and self._device_type(t) != "meta":
                self._see(t, self.phase)
        if self.total >= self.peak:  # >=: what the last op allocated was retagged by this one
            self.reset_peak()

    def _see(self, t: torch.Tensor, category: str, force: bool = False) -> None:
        st = t.untyped_storage()
        entry = self._live.get(id(st))
        if entry is None:
            n = st.nbytes()
            self._live[id(st)] = [weakref.ref(st, partial(self._free, id(st))), n, category]
            self.bytes[category] += n
            self.total += n
            self._fresh = True
            self.high[category] = max(self.high[category], self.bytes[category])
        elif force and entry[2] != category:
            self.bytes[entry[2]] -= entry[1]
            self.bytes[category] += entry[1]
            entry[2] = category
            self.high[category] = max(self.high[category], self.bytes[category])

    def _free(self, key: int, _ref) -> None:
        _, n, category = self._live.pop(key)
        self.bytes[category] -= n
        self.total -= n


class StorageCounter(_Counting, FakeTensorMode):
    """FakeTensorMode that counts (`_Counting`): nothing is allocated, any scale traces.

    One mode, not a TorchDispatchMode stacked on FakeTensorMode: each op crosses into Python once,
    not twice, and the `prim.device` queries (more than the ops) are answered here directly. Ops
    that FakeTensorMode runs inside another (decompositions) are not counted, as a mode stacked
    above it would not see them.

    `nn.Module.to` works in it: the converter's memo of fresh op outputs would put a weakref on
    every Parameter, and `Module._apply` then refuses to swap fake parameters (pytorch#178584); a
    fresh meta tensor is never looked up again, so nothing is lost by not memoizing."""

    def __init__(self, retag=lambda: ()):
        super().__init__()
        self.fake_tensor_converter.set_tensor_memo = lambda t, v: None
        self._depth = 0  # ops under way: FakeTensorMode re-enters itself to decompose
        self._start_counting(retag)

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

    def __init__(self, retag=lambda: ()):
        super().__init__()
        self._start_counting(retag)

    @staticmethod
    def _device_type(t: torch.Tensor) -> str:
        return t.device.type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._counted(out)
        return out
