"""ZeRO-R (paper §6): P_a, P_a+cpu, C_B and M_D on a dp = 2 × mp = 2 world, against the
single-process reference, the checkpoint-memory formula and the ledger (paper.md §1.2–1.4)."""

import pytest
import torch

from tests.engine_cases import clone, engine_run, reference_run, rel_err, spec_for
from tests.worlds import threaded
from zerobench import cli, memory, trial
from zerobench.engine.config import ZERO_CONFIGS
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.zero.activations import checkpoint_store
from zerobench.engine.zero.buffers import AllocationCounter, largest_bucket_bytes
from zerobench.runtime.train import build_engine, train_steps

DP, MP, B = 2, 2, 2
SWITCHES = {
    "checkpoint": dict(checkpoint_activations=True),
    "P_a": dict(checkpoint_activations=True, partition_activations=True),
    "P_a+cpu": dict(checkpoint_activations=True, partition_activations=True, offload_activations=True),
}


def _spec(stage=2, model="tiny", **switches):
    return spec_for(model, dp=DP, mp=MP, stage=stage, micro_batch=B, **switches)


def _probe(rank, spec):
    """One warm-up step, then one counted step: checkpoint bytes, ledger and allocations."""
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    comms = Comms()
    engine = build_engine(spec, ctx, comms, torch.device("cpu"))
    train_steps(engine, spec, ctx, 1)
    store = checkpoint_store(engine.model)
    allocations_after_warmup = store.allocations
    comms.ledger.reset()
    with AllocationCounter() as counter:
        train_steps(engine, spec, ctx, 1, first_step=1)
    return {
        "device": store.peak_device_bytes,
        "host": store.peak_host_bytes,
        "held_after_step": (store.device_bytes, store.host_bytes),
        "store_allocations": (allocations_after_warmup, store.allocations),
        "allocations": counter.count,
        "ledger": {k: (v["calls"], v["volume_elements"], v["bytes"]) for k, v in comms.ledger.as_dict().items()},
    }


@pytest.fixture(scope="module")
def probes():
    """Every switch with and without M_D, each in its own threaded world."""
    return {
        (name, md): threaded(DP * MP, _probe, _spec(**switches, contiguous_buffers=md))
        for name, switches in SWITCHES.items()
        for md in (False, True)
    }


def test_checkpoint_bytes_per_rank(probes):
    """Whole checkpoints: b·s·h·L elements per rank; P_a: 1/N_m of that; P_a+cpu: none on the
    device, 1/N_m on host (fp32 compute on CPU: 4 bytes an element)."""
    cfg = _spec().model
    whole = B * cfg.seq * cfg.hidden * cfg.layers * 4  # one fp32 block input per layer
    part = whole // MP
    assert memory.checkpoint_bytes(B, cfg.seq, cfg.hidden, cfg.layers, elem_bytes=4) == whole
    assert memory.checkpoint_bytes(B, cfg.seq, cfg.hidden, cfg.layers, MP, partitioned=True, elem_bytes=4) == part
    expected = {"checkpoint": (whole, 0), "P_a": (part, 0), "P_a+cpu": (0, part)}
    for (name, _), ranks in probes.items():
        for r in ranks:
            assert (r["device"], r["host"]) == expected[name], name
            assert r["held_after_step"] == (0, 0)  # every checkpoint was released by its backward


def test_partition_overhead_is_one_twelfth_of_mp(probes):
    """P_a adds one all-gather of b·s·h per block per step (volume b·s·h·(N_m−1)/N_m): 1/12 of the
    block's MP all-reduce volume with checkpointing (12·b·s·h·(N_m−1)/N_m, counted from the ledger
    in test_model_parallel.py), and under the paper's 10% of the measured MP all-reduce volume."""
    cfg = _spec().model
    bsh, ring = B * cfg.seq * cfg.hidden, (MP - 1) / MP
    base = probes[("checkpoint", False)][0]["ledger"]
    for name in ("P_a", "P_a+cpu"):
        led = probes[(name, False)][0]["ledger"]
        calls, gather, _ = led["all_gather/mp"]
        assert calls == cfg.layers and gather == pytest.approx(cfg.layers * bsh * ring)
        assert led["all_reduce/mp"] == base["all_reduce/mp"]  # P_a adds, never changes, MP traffic
        assert gather / led["all_reduce/mp"][1] < 0.10
    assert "all_gather/mp" not in base


def test_offload_moves_the_partitions_to_host_and_back(probes):
    cfg = _spec().model
    part_bytes = B * cfg.seq * cfg.hidden * 4 // MP  # per block
    for md in (False, True):
        for r in probes[("P_a+cpu", md)]:
            led = r["ledger"]
            assert led["copy_to_host/host"] == (cfg.layers, cfg.layers * part_bytes / 4, cfg.layers * part_bytes)
            assert led["copy_to_device/host"] == led["copy_to_host/host"]
    assert not any(k.endswith("/host") for k in probes[("P_a", False)][0]["ledger"])


def test_contiguous_buffers_allocate_once(probes):
    """M_D: the store allocates its buffers in the first step only (slots, gather buffer, reload
    buffer); without it, a tensor per block and step for each. Counted by a dispatch mode over a
    whole training step, the step allocates exactly that many fewer tensors with M_D."""
    layers = _spec().model.layers
    per_block = {"checkpoint": 0, "P_a": 2, "P_a+cpu": 3}  # kept chunk, gathered input, reloaded chunk
    for name, n in per_block.items():
        without, with_md = probes[(name, False)], probes[(name, True)]
        for a, b in zip(without, with_md):
            assert a["store_allocations"] == (n * layers, 2 * n * layers)
            assert b["store_allocations"][0] == b["store_allocations"][1]  # nothing after the first step
            if name == "checkpoint":
                assert b["store_allocations"][0] == 1  # whole checkpoints copied into one buffer
            else:
                assert b["store_allocations"][0] == n
            assert a["allocations"] - b["allocations"] == n * layers


@pytest.mark.parametrize(
    "config, stage", [(c, ZERO_CONFIGS[c]["stage"]) for c in ZERO_CONFIGS] + [("P_a+cpu, stage 3", 3)]
)
def test_parity_of_zero_configs(config, stage):
    """C1–C5 (SC20 Table III) with checkpointing on, dp = 2 × mp = 2, equal the single-process run."""
    switches = dict(ZERO_CONFIGS.get(config, SWITCHES["P_a+cpu"]), stage=stage, checkpoint_activations=True)
    spec = spec_for("tiny", dp=DP, mp=MP, micro_batch=B, steps=3, **switches)
    out = threaded(DP * MP, engine_run, spec)
    ref = reference_run(spec)
    for r in out:
        assert rel_err(r["params"], ref["params"]) < 1e-5


def test_offload_at_mp_1_moves_whole_checkpoints_and_trains_alike():
    """P_a+cpu at MP 1 (DeepSpeed's CPU checkpointing without MP): P_a splits nothing, so every
    block's whole input goes to the host and back (b·s·h fp32 elements each), none stays on the
    device, and stage 3 on dp = 2 trains as the single-process run."""
    spec = spec_for("tiny", dp=DP, mp=1, stage=3, micro_batch=B, steps=2, **SWITCHES["P_a+cpu"])
    cfg = spec.model
    whole = B * cfg.seq * cfg.hidden * 4  # one fp32 block input
    ref = reference_run(spec)

    def probe(engine):
        store = checkpoint_store(engine.model)
        return store.peak_device_bytes, store.peak_host_bytes

    for r in threaded(DP, engine_run, spec, probe):
        assert r["probes"] == [(0, cfg.layers * whole)] * spec.train.steps
        for copy in ("copy_to_host/host", "copy_to_device/host"):  # fp32: 4 bytes an element
            assert (r["calls"][copy], r["volume"][copy]) == (2 * cfg.layers, 2 * cfg.layers * whole / 4)
        assert rel_err(r["params"], ref["params"]) < 1e-5


def _layout(rank, spec):
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    engine = build_engine(spec, ctx, Comms(), torch.device("cpu"))
    return engine.layout, max(p.numel() for p in engine.params)


def test_constant_buffer_bound():
    """C_B: the largest fused buffer is max(C_B, largest parameter) rounded up to N_d elements —
    unchanged when the model grows from 2 to 8 layers (4× Ψ); a parameter wider than C_B (the
    vocab-parallel embedding of cpu-10m, 8192·256/2 elements) is the bucket's size instead."""
    c_b = 64 * 1024
    sizes = {}
    for model, layers in (("tiny", 2), ("tiny", 8), ("cpu-10m", 1)):
        spec = spec_for(model, dp=DP, mp=MP, bucket_bytes=c_b)
        spec = clone(spec, model=spec.model.with_overrides(layers=layers))
        layout, biggest = threaded(DP * MP, _layout, spec)[0]
        largest = largest_bucket_bytes(layout, 4)
        bound = -(-max(c_b // 4, biggest) // DP) * DP * 4
        assert largest <= bound
        sizes[(model, layers)] = (largest, layout.numel, biggest * 4)
    assert sizes[("tiny", 2)][0] == sizes[("tiny", 8)][0] <= c_b
    assert sizes[("tiny", 8)][1] > 3 * sizes[("tiny", 2)][1]
    assert sizes[("cpu-10m", 1)][0] == sizes[("cpu-10m", 1)][2] > c_b


def test_zero_configs_from_the_cli():
    for name, switches in ZERO_CONFIGS.items():
        args = cli.parser().parse_args(["run", "--zero-config", name, "--dp", "2", "--mp", "2"])
        parallel = trial.configs(vars(args))[1]
        for key, value in switches.items():
            assert getattr(parallel, key) == value
        assert parallel.checkpoint_activations == bool(switches.get("partition_activations"))  # P_a implies it
