"""`zerobench plan`: the ranking against a brute force over every layout, the errors that name their
field, the trace check dropping a layout over the card, and the command's outputs."""

import csv
import dataclasses
import itertools
import re

import pytest

from zerobench.cli import main
from zerobench.engine.config import ModelConfig, ParallelConfig, TrainConfig
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.hardware import PROFILES
from zerobench.perfmodel.paper_setups import PAPER_BUCKET
from zerobench.perfmodel.predict import predict
from zerobench.plan.answer import picks, shown, table
from zerobench.plan.rank import ACTIVATIONS, memory, micro_batches, rank
from zerobench.plan.request import PlanRequest
from zerobench.stages import STAGES
from zerobench.trial.errors import InputError

SMALL = ModelConfig(layers=8, hidden=2048, heads=16, seq=1024, name="small")  # 0.45B
# a card of 12 GB, nothing reserved: small enough that stages and micro-batches are cut by memory
CARD = dataclasses.replace(PROFILES["v100-32gb-dgx2"], name="card-12gb", memory_bytes=12e9, gpus_per_node=4,
                           reserve_bytes=0, fragmentation_bytes=0)  # fmt: skip


def _brute_force(req: PlanRequest) -> dict[tuple, float]:
    """Every layout that fits, found without the planner: each micro-batch dividing B / dp tried by
    predict itself -> tokens per second."""
    out = {}
    buckets = {stage: (ParallelConfig.bucket_bytes, PAPER_BUCKET) if stage else (ParallelConfig.bucket_bytes,)
               for stage in STAGES}  # fmt: skip
    for mp, stage, (ckpt, pa, cpu), md in itertools.product((1, 2, 4), STAGES, ACTIVATIONS, (False, True)):
        if pa and not cpu and mp == 1:  # P_a alone splits nothing at MP 1; P_a+cpu moves checkpoints to the host
            continue
        dp = req.gpus // mp
        per = req.global_batch // dp
        for bucket, b in itertools.product(buckets[stage], (b for b in range(1, per + 1) if per % b == 0)):
            par = ParallelConfig(dp=dp, mp=mp, stage=stage, bucket_bytes=bucket, checkpoint_activations=ckpt,
                                 partition_activations=pa, offload_activations=cpu, contiguous_buffers=md)  # fmt: skip
            train = TrainConfig(micro_batch=b, grad_accum=per // b)
            p = predict(req.model, par, req.precision_config, train, CARD, attention=req.attention)
            if p.fits:
                out[(mp, stage, ckpt, pa, cpu, md, bucket, b)] = req.global_batch * req.model.seq / p.step_time_s
    return out


def test_the_ranking_is_the_brute_force_ranking():
    req = PlanRequest(SMALL, 8, CARD, global_batch=64)
    rows = rank(req, progress=None)
    brute = _brute_force(req)
    keys = ("mp", "stage", "checkpoint_activations", "partition_activations", "offload_activations",
            "contiguous_buffers", "bucket_mb", "micro_batch")  # fmt: skip
    got = {tuple(round(r[k] * 2**20) if k == "bucket_mb" else r[k] for k in keys): r["tokens_per_s"] for r in rows}
    assert got.keys() == brute.keys()  # every layout that fits, none that does not
    assert got == pytest.approx(brute, rel=1e-12)
    assert len({r["stage"] for r in rows}) > 1 and len({r["micro_batch"] for r in rows}) > 1  # memory cut some
    assert any(r["mp"] == 1 and r["offload_activations"] for r in rows)  # P_a+cpu at MP 1 is searched
    by_speed = sorted(rows, key=lambda r: -r["tokens_per_s"])
    assert by_speed[0]["tokens_per_s"] == max(brute.values()) and by_speed[0]["rank"] == 1
    assert all(b["rank"] - a["rank"] in (0, 1) for a, b in zip(by_speed, by_speed[1:]))
    assert all(r["micro_batch"] * r["grad_accum"] * r["dp"] == 64 for r in rows)
    # the frontier: no layout at least as fast with less memory; off it, one at least as fast with no more
    for r in rows:
        faster = [o for o in rows if o["tokens_per_s"] >= r["tokens_per_s"] and o is not r]
        assert r["frontier"] == (not any(o["memory_bytes"] < r["memory_bytes"] for o in faster)) or any(
            o["memory_bytes"] == r["memory_bytes"] for o in faster
        )
    # the tied group: the offered layouts inside the fastest offered one's band, first, most headroom first
    lead = next(r for r in by_speed if r["headroom_bytes"] >= 0.05 * r["usable_bytes"])
    floor = lead["tokens_per_s"] * (1 - lead["band_pct"] / 100)
    group = [r for r in rows if r["tied"]]
    assert group == rows[: len(group)] and len(group) > 1
    assert {id(r) for r in group} == {
        id(r) for r in rows if r["tokens_per_s"] >= floor and r["headroom_bytes"] >= 0.05 * r["usable_bytes"]
    }
    headrooms = [r["headroom_pct"] for r in group]
    assert headrooms == sorted(headrooms, reverse=True)
    rest = [r["tokens_per_s"] for r in rows[len(group) :]]
    assert rest == sorted(rest, reverse=True)
    # the top shows distinct speeds in that order, each with its alike count (C_B and M_D variants)
    top = shown(rows, 3)
    assert [t["layout"] for t in top][:1] == [rows[0]["layout"]] and len({t["rank"] for t in top}) == 3
    assert top[0]["alike"] == sum(r["rank"] == top[0]["rank"] for r in rows) - 1


def test_c_b_and_m_d_are_priced_alike():
    """The planner predicts a layout's speed once for its C_B and M_D variants (rank._priced): it
    holds while predict prices neither."""
    times = {
        predict(SMALL, ParallelConfig(dp=4, mp=2, stage=s, bucket_bytes=bucket, contiguous_buffers=md,
                                      checkpoint_activations=True), PlanRequest(SMALL, 8, CARD).precision_config,
                TrainConfig(micro_batch=2), CARD).step_time_s
        for bucket in (ParallelConfig.bucket_bytes, PAPER_BUCKET) for md in (False, True) for s in (3,)
    }  # fmt: skip
    assert len(times) == 1


def test_micro_batches_without_and_with_a_global_batch():
    assert micro_batches(12, 4, None) == [(12, 1), (8, 1), (4, 1), (2, 1), (1, 1)]
    assert micro_batches(5, 4, 48) == [(4, 3), (3, 4), (2, 6), (1, 12)]
    assert micro_batches(0, 4, 48) == [] and micro_batches(3, 5, 48) == []


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hardware="v100-99gb"), "hardware="),
        (dict(mp=3), "heads="),
        (dict(gpus=0), "gpus="),
        (dict(top=0), "top="),
        (dict(global_batch=7, mp=1), "global_batch="),
        (dict(precision="fp8"), "precision="),
        (dict(implementation="megatron"), "implementation="),
        (dict(headroom=-1), "headroom="),
        (dict(headroom=True), "headroom="),
        (dict(gpus=97), r"gpus=97: not whole nodes of 8 GPUs \(a100-80gb\)"),
        (dict(gpus=64, global_batch=4), r"gpus=64: too many for global_batch=4: .* at most 32 GPUs"),
    ],
)
def test_a_bad_request_names_its_field(changes, field):
    with pytest.raises(InputError, match=field):
        PlanRequest(**{"model": SMALL, "gpus": 8, "hardware": "a100-80gb", **changes})


def test_no_layout_that_fits_names_the_gpus_on_which_one_does():
    """The fewest whole nodes on which the model fits is named, and one node fewer does not fit."""
    huge = ModelConfig(layers=64, hidden=8192, heads=64, name="huge")
    with pytest.raises(InputError, match=r"gpus=4: no layout of huge .* fits .* fits from (\d+) GPUs") as err:
        rank(PlanRequest(huge, 4, CARD), progress=None)
    fewest = int(re.search(r"fits from (\d+) GPUs", str(err.value)).group(1))
    assert rank(PlanRequest(huge, fewest, CARD), progress=None)
    with pytest.raises(InputError, match=f"gpus={fewest - 4}: no layout"):
        rank(PlanRequest(huge, fewest - 4, CARD), progress=None)


def test_materialized_attention_keeps_its_scores():
    """GPT-3 175B at seq 2048: the same layout priced with materialized attention holds at least one
    layer's s² scores (b·heads/N_m·s², 16-bit) more than with the fused kernel this engine runs; a
    layout without checkpointing, every layer's."""
    gpt3 = ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, name="gpt3-175b")
    scores = 2 * 96 // 8 * 2048**2 * 2  # micro-batch 2, MP 8, fp16
    for ckpt, layers in ((True, 1), (False, 96)):
        parallel = ParallelConfig(dp=128, mp=8, stage=3, checkpoint_activations=ckpt)
        mem = {a: memory(PlanRequest(gpt3, 1024, "a100-80gb", attention=a), parallel, 2, DEFAULT)
               for a in ("fused", "materialized")}  # fmt: skip
        more = mem["materialized"].total_bytes - mem["fused"].total_bytes
        assert more >= layers * scores and mem["materialized"].usable_bytes == mem["fused"].usable_bytes


def test_the_headroom_keeps_tight_layouts_from_the_picks(capsys):
    """A layout leaving less than --headroom free is not a pick (its row says so); each pick shows
    its headroom, and the table names the tied group and what would break the tie."""
    req = PlanRequest(SMALL, 8, CARD, global_batch=64, headroom=20)
    rows = rank(req, progress=None)
    assert {r["offered"] for r in rows} == {True, False}
    assert all(r["offered"] == (r["headroom_pct"] >= 20) for r in rows)
    assert all(r["offered"] for r in picks(rows, 5)) and all(not r["tied"] for r in rows if not r["offered"])
    text = table(req, rows, picks(rows, 5))
    assert "tied:" in text and "--verify emulate" in text and "not offered:" in text
    assert all(f"{r['headroom_pct']:.1f}%" in text for r in picks(rows, 5))
    materialized = dataclasses.replace(req, attention="materialized")
    assert "`--verify trace` checks this engine" in table(materialized, rows, picks(rows, 5))


def test_verify_trace_drops_a_layout_the_trace_says_does_not_fit():
    """The first layout checked is traced for real and made one byte over its card (a construction
    the model knows nothing of): it is dropped, the next is traced and kept, the rest ranked again."""
    from zerobench.plan.verify import verify
    from zerobench.runtime.trace import trace_record  # imports torch

    model = ModelConfig(layers=2, hidden=64, heads=4, seq=32, vocab=256, name="tiny")
    req = PlanRequest(model, 2, "a100-80gb", global_batch=4, top=1)
    rows = rank(req, progress=None)
    first = shown(rows, 1)[0]
    seen = []

    def tracer(spec):
        assert spec.precision.device == "cuda"  # the target's device semantics, passed explicitly
        record = trace_record(spec)
        seen.append(record)
        if len(seen) == 1:  # over the card by one byte
            record = {**record, "peak_allocated_bytes": first["usable_bytes"] + 1}
        return record

    out, top = verify(req, rows, "trace", tracer=tracer, progress=None)
    assert len(seen) == 2 and all(r["status"] == "ok" for r in seen)
    dropped = next(r for r in out if r["layout"] == first["layout"])
    assert dropped["rank"] is None and dropped["traced_fits"] is False and dropped["checked"] == "traced"
    assert top[0]["layout"] != first["layout"] and top[0]["checked"] == "traced" and top[0]["tied"]
    assert top[0]["memory_bytes"] == max(seen[1]["peak_allocated_bytes"], seen[1]["build_peak_bytes"])
    ranked = [r for r in out if r["rank"] is not None]
    alike = [r for r in out if r.get("dropped_as_alike_to") == first["layout"]]
    assert alike and all(r["rank"] is None and r["memory_bytes"] >= first["memory_bytes"] for r in alike)
    assert len(ranked) == len(rows) - 1 - len(alike) and ranked[0]["layout"] == top[0]["layout"]
    assert min(r["rank"] for r in ranked) == 1


def test_the_command_writes_its_table_csv_and_figure(tmp_path, capsys):
    out, fig = tmp_path / "plan.csv", tmp_path / "plan.png"
    argv = ["plan", "--model", "gpt-1.5b", "--gpus", "16", "--hardware", "a100-80gb", "--global-batch", "64",
            "--top", "3", "--out", str(out), "--figure", str(fig)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "gpt-1.5b" in text and sum(line.endswith("modelled") for line in text.splitlines()) == 3
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["tied"] == "True" and {r["checked"] for r in rows} == {"modelled"} and fig.stat().st_size > 0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA GPU is here: emulate would run")
def test_verify_emulate_without_a_gpu_names_it(capsys):
    argv = ["plan", "--model", "tiny", "--gpus", "2", "--hardware", "a100-80gb", "--verify", "emulate"]
    assert main(argv) == 2
    assert "verify=emulate: needs a local CUDA GPU" in capsys.readouterr().err
