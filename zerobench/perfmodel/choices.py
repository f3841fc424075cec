"""The ledger of model choices: every fitted constant, every switch chosen on scores, every
profile-to-source mapping and every margin taken from measurements, each with the rows it was
fitted or chosen on (by key) and the commit that introduced it (design.md "Sources of numbers": a
switch or profile chosen while looking at a row is a fit of that row, and the row says so).

A row is named `(artifact, key)`: a paper artifact's table key (results/<artifact>.csv), an H200
record (`gpu/h200`, "<preset> stage <s> micro-batch <b>") or a published run's source
(`external_runs`, "<source>": all its rows). `role_of` in artifacts/judging/common.py reads `fitted_rows`;
docs/perfmodel.md "The ledger of model choices" prints `markdown()`. A row whose prediction carries
a term fitted on runs like it (`carriers`) is `fitted` too (common.ROLES). A choice made on an artifact's
mean rather than on rows names no row and says why its rows stay judged (`rows_judged_because`).
`without` is what reverses the choice where the model can price that (trial fields of a sheet,
Calibration fields, or fields of the trial's hardware profile): the tables then show the row both ways
(artifacts/judging/choice_readings.py), and tests/unit/test_choices.py reverts it and checks that the rows
whose prediction moves are exactly its `rows`, `carriers` and `moves`. A choice made while an
artifact's rows were in view names the rows of it that it moves, whatever it was chosen on (a row, or
a mean). An assumed value no row was looked at for names the rows it moves in `moves`: they stay
judged, shown without it too, and a claim read from one takes the worse reading.

Complete by construction: each choice names the Calibration and hardware-profile fields it sets
(`fields`); every other field of both is either `SOURCED` (a datasheet's, the paper's or a measured
profile's, with where from) or moves no paper row, which tests/unit/test_choices.py checks by moving
all of them at once (`unaccounted`): a switch added to either type and left off the ledger fails it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.perfmodel.constants import FITTED

KINDS = ("fitted", "switch", "mapping", "margin", "assumed")  # assumed: a value set with no measurement, source or fit


@dataclass(frozen=True)
class Choice:
    name: str
    kind: str  # KINDS
    what: str
    rows: tuple[tuple[str, str], ...]  # the rows it was fitted or chosen on: (artifact, key)
    commit: str  # the commit that introduced it
    without: tuple[tuple[str, object], ...] = ()  # (field, value) that reverses it; () where none
    carriers: tuple[tuple[str, str], ...] = ()  # rows whose prediction carries the term, fitted on runs like them
    rows_judged_because: str = ""  # a choice naming no row: why the rows it moves stay judged
    fields: tuple[str, ...] = ()  # the Calibration and hardware-profile fields it sets
    moves: tuple[tuple[str, str], ...] = ()  # rows an assumed value moves; judged, shown without it too

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"choice {self.name}: kind={self.kind!r} must be one of {KINDS}")
        if not self.rows and not self.rows_judged_because:
            raise ValueError(f"choice {self.name}: names no row, so it must say why its rows stay judged")


def _rows(key: str) -> tuple[tuple[str, str], ...]:
    return tuple(FITTED[key])


_THROUGHPUT = "gemm_eff_max, tokens_half, elementwise_traffic, ib_efficiency, nvlink_efficiency"
H200_FITTED_ROW = ("gpu/h200", "gpt-1.5b stage 3 micro-batch 1")
MEGATRON_2021 = ("external_runs", "megatron-lm-2021")
# The rows a switch moves, in the artifacts that were in view when it was chosen (tests/unit/test_choices.py
# reverts each and compares): listed batches capped, ZeRO's reduction not overlapped.
_OVERLAP = (
    *(("fig2", f"ZeRO {m}B") for m in ("1.5", 8, 40, 60, 80, 100, 120, 140, 170)),
    *(("fig3", f"{n} GPUs") for n in (64, 128, 256, 400)),
    *(("fig7", k) for k in ("60B C3", "60B C4", "60B C5", "170B C5")),
    *(("fig8", f"ZeRO {m}B") for m in ("1.5", 2.5, 4, 6, 8, 10, 11, 12, 13)),
)
# The memory rows of the paper's artifacts on the V100 (Table 2, Figs 5, 6 and 8's largest models): each
# carries the terms outside the engine's tensors that the V100 profile does not measure.
_TABLE2 = tuple(
    ("table2", f"MP {mp} {what}")
    for mp in (1, 2, 4, 8, 16)
    for what in ("baseline measured", "P_os measured", "P_os+g modelled", "P_os+g+p modelled")
)
_FIG6 = tuple(("fig6", k) for k in ("40B C1", "40B C2", "40B C3", "40B C4", "40B C5", "100B C4", "100B C5"))
_NCCL = (
    *(("fig5", f"C{c}") for c in (2, 3, 4, 5)),
    *_FIG6,
    ("fig8", "max model DDP"),
    ("fig8", "max model ZeRO-DP"),
    *(r for r in _TABLE2 if "baseline" not in r[1] and r[1] != "MP 1 P_os+g modelled"),
)
# The rows the V100's memory size and the CUDA context move (their `moves`: each priced again without
# it, tests/unit/test_choices.py): every Fig 5 and Fig 6 row, and Table 2's rows whose largest model
# crosses a layer at the change.
_FIG5 = tuple(("fig5", f"C{c}") for c in range(1, 6))
_TABLE2_STAGES = tuple(r for r in _TABLE2 if "baseline" not in r[1] and "MP 8 P_os measured" != r[1])
_V100_MEMORY = (
    *_FIG5, *_FIG6, *(r for r in _TABLE2_STAGES if "P_os measured" not in r[1]),
    *(("table2", f"MP {mp} {w}") for mp in (4, 8) for w in ("baseline measured",)), ("table2", "MP 8 P_os measured"),
)  # fmt: skip
_CONTEXT = (
    *_FIG5, *_FIG6, ("fig7", "60B C3"), ("fig8", "max model DDP"), ("fig8", "max model ZeRO-DP"),
    *(r for r in _TABLE2 if "baseline" not in r[1]),
    *(("table2", f"MP {mp} baseline measured") for mp in (1, 4, 8)),
)  # fmt: skip

CHOICES = (
    Choice(_THROUGHPUT, "fitted", "V100 compute and link constants (Nelder-Mead on the points' mean |error|; "
           "width_half, also fitted, went to 0: off)",
           _rows(_THROUGHPUT), "4ada614", fields=(*_THROUGHPUT.split(", "), "width_half")),
    Choice("reserve_bytes", "fitted", "memory never usable per GPU: 1.70 GiB (grid scan); since the paper's "
           "artifacts price this engine's memory (engine_memory.py), it applies only to other codes' runs "
           "(fitting/external.py CODE), and the rows it was fitted on carry the NCCL allowance instead",
           _rows("reserve_bytes"), "4ada614", fields=("reserve_bytes",)),
    Choice("fragmentation", "fitted", "fraction of a V100 the caching allocator holds beyond the tensors without "
           "M_D: 0.105; every Table 2 row and Fig 8's largest DDP model carry it", _rows("fragmentation"),
           "4ada614", without=(("fragmentation", 0.0),), fields=("fragmentation", "fragmentation_bytes"),
           carriers=(*(r for r in _TABLE2 if r != ("table2", "MP 1 P_os measured")), ("fig8", "max model DDP"))),
    Choice("cache_headroom", "fitted", "fraction of free headroom PyTorch's cache holds: 0.42; every Fig 6 cached "
           "figure carries it (the C4 -> C5 claims read the engine's traced allocated peak instead)",
           _rows("cache_headroom"), "4ada614", without=(("cache_headroom", 0.0),), fields=("cache_headroom",),
           carriers=tuple(r for r in _FIG6 if r != ("fig6", "40B C4"))),
    Choice("NCCL bytes per communicator without NVLS", "assumed", "688 MB per communicator on a V100 "
           "(engine_memory.py NCCL_COMMUNICATOR_BYTES_NO_NVLS): the top of 544-688 MB measured on 4 NVLink A100s "
           "(NVIDIA/nccl#964), no V100 measurement; taken with fig2 ZeRO 170B and fig7 170B C5 in view. Undone: "
           "the range's bottom, 544 MB", (), "5ead74c", without=(("nccl_communicator_bytes", 544e6),),
           carriers=_NCCL, rows_judged_because="the 170B rows in view fit at their listed batch at 544 MB too, so it "
           "moves none of them; the memory rows it moves carry it", fields=("nccl_communicator_bytes",)),
    Choice("H200 memory margins", "margin", "the H200's unusable bytes measured on our card (hardware.py "
           "H200_RESERVE_BYTES: the driver's 615 MiB plus an assumed 400 MB CUDA context) and the caching "
           "allocator's overhead, H200_FRAGMENTATION_BYTES: the largest peak reserved minus allocated of the twelve "
           "H200 runs (2.28 GB), in place of the V100's fitted 10.5 %; with the V100's terms 2 of the 12 are called "
           "out of memory", (), "6707047", rows_judged_because="it decides only whether a layout fits an H200; "
           "no H200 row's number (results/gpu/h200/compare.csv: time and allocated bytes) and no paper row moves "
           "with it", fields=("reserve_bytes", "fragmentation_bytes")),
    Choice("per_hardware", "fitted", "A100 and H100 tokens_half and elementwise_traffic, on each GPU's fit rows",
           _rows("per_hardware"), "4b2dfcb", fields=("per_hardware",)),
    Choice("h200 = h100 compute constants", "mapping", "the H200 takes the H100's fitted tokens_half and "
           "elementwise_traffic (same die, clocks, power)", (),
           "4b2dfcb", rows_judged_because="set from datasheets before any H200 row was scored"),
    Choice("host_cost.GATHER_HOST_S", "fitted", "host seconds per module gathered at stage 3 on a GPU: 70.2 µs; it "
           "moves two other H200 rows (dp-6b mb 1 +37.8 -> +11.0 %, gpt-1.5b mb 4 +4.2 -> -8.1 %), which carry it; "
           "the other three stage 3 rows it leaves unchanged", (H200_FITTED_ROW,), "6707047",
           carriers=(("gpu/h200", "gpt-1.5b stage 3 micro-batch 4"), ("gpu/h200", "dp-6b stage 3 micro-batch 1"))),
    Choice("ddp_overlap", "switch", "PyTorch DDP (stage 0, MP 1) all-reduces its buckets during backward",
           (("fig8", "DDP 1.38B"), ("fig8", "DDP 1.16B")), "75e1158", without=(("ddp_overlap", False),),
           fields=("ddp_overlap",)),
    Choice("fig3 batch: largest swept that fits", "switch", "Fig 3 keeps the largest batch of the authors' sweep "
           "that fits (the largest integer batch read +34 % at 64 GPUs at 75e1158)", (("fig3", "64 GPUs"),),
           "534433b"),
    Choice("listed batches capped to what fits", "switch", "a listed micro-batch the memory model calls out of "
           "memory is lowered to the largest that fits (`micro_batch_policy: largest_fits`), chosen with fig2, fig3, "
           "fig7 and fig8's scores in view (75e1158's message); on the engine's memory it lowers one paper row, "
           "fig7 60B C3 (listed 32, fits 11); without it that row is out of memory, no number",
           (("fig7", "60B C3"),), "75e1158", without=(("micro_batch_policy", "listed"),)),
    Choice("tensor-core alignment", "switch", "on the V100 profile (CUDA 10.0), a head size not a multiple of 8 "
           "runs the attention scores' GEMMs without tensor cores at 31.4 TFLOPS (hardware.py "
           "`tensor_core_align`, `unaligned_flops`; compute.py); put in with fig2 in view: without it fig2 ZeRO "
           "1.5B reads +33.8 % and baseline 1.5B +26.6 % instead of +14.4 and +10.4 %",
           (("fig2", "ZeRO 1.5B"), ("fig2", "baseline 1.5B")), "30f91c2", without=(("unaligned_flops", 0.0),),
           fields=("tensor_core_align", "unaligned_flops")),
    Choice("overlap_grad_reduce off", "switch", "ZeRO's gradient reduction does not hide behind backward; chosen "
           "on the mean |error| of fig2, fig3, fig7 and fig8 with it on and off, so the rows of those it moves",
           _OVERLAP, "4ada614", without=(("overlap_grad_reduce", True),), fields=("overlap_grad_reduce",)),
    Choice("stage 3 gathers not overlapped", "switch", "neither profile hides stage 3's gathers behind compute", (),
           "4ada614", rows_judged_because="kept as the model had it, not re-chosen: the llm-foundry A100 rows "
           "(validation) were scored with it"),
    Choice("hbm_efficiency, adam_bytes_per_param, step_overhead_s", "assumed", "the fixed costs: 80 % of HBM "
           "bandwidth in the Adam step, 28 bytes moved per parameter (fp32 p, m, v read and written, a 16-bit "
           "gradient in and parameter out), 0.10 s per step of launch, norm and loss-scale bookkeeping", (),
           "4ada614", rows_judged_because="set in the model's first commit, which had no tables to score (no "
           "results/ in 4ada614), and never refitted; no measurement or source backs the values: assumptions",
           fields=("hbm_efficiency", "adam_bytes_per_param", "step_overhead_s")),
    Choice("deepspeed-0.3 for megatron-lm-2021", "mapping", "Megatron-LM 2021's ZeRO-3 runs priced as DeepSpeed's "
           "2021 stage 3 (list-form collectives, a wait per gather); the mechanism was designed after these six "
           "runs were first scored (69.1 % mean |error| at 8097880, growing with GPUs)", (MEGATRON_2021,),
           "b2c03e2"),
    Choice("host_cost.HOST_OP_S for deepspeed-0.3", "margin", "12.67 µs per list-form host op, measured on this "
           "engine's H200 calibration and borrowed for DeepSpeed 2021 on A100 hosts", (MEGATRON_2021,), "b2c03e2"),
    Choice("fitting/external.CODE", "mapping", "each published source's memory priced from its own code "
           "(feasibility.code_breakdown): llm-foundry as PyTorch FSDP with a fused cross-entropy, NeMo with fp32 "
           "main gradients, the logits at 2 + 4 bytes (Megatron's fp32 softmax copy) where not fused; chosen with "
           "the external runs' out-of-memory calls in view (c9a046d: 24 -> 6 of 77)", (), "c9a046d",
           rows_judged_because="it decides only whether an external run fits (`model_fits`), which no band, "
           "coverage or verdict reads; every external row's throughput error, which they read, is the same "
           "with it and without it", fields=("fused_cross_entropy", "fsdp", "fp32_main_grads", "fp32_grad_shard")),
    Choice("runtime_bytes, checkpoint_runtime_bytes, mp_sync_table", "fitted", "calibrated CPU profile terms, "
           "fitted on calibrate's own runs", (), "4ada614",
           rows_judged_because="model_vs_measured and capacity label every row these terms change `fitted` "
           "themselves (vs_measured.MEMORY_TERMS, TIME_TERMS) and give the verdict without them",
           fields=("runtime_bytes", "checkpoint_runtime_bytes", "mp_sync_table")),
    Choice("zero_os_stage1 off: P_os as DeepSpeed's May 2020 code", "mapping", "the paper's P_os rows (Figs 5-7) "
           "priced as DeepSpeed's stage 1 of May 2020, which reduce-scatters a flat copy of every gradient (2Ψ′ "
           "volume and transient), not as ZeRO-OS of February 2020, which all-reduces without a copy (Table 2's "
           "measured P_os, `zero_os: true` in its sheet); put in with fig5 and fig7's errors in view (72411bb's "
           "message: fig7 C1 -33 -> -14 %, C2 +9 -> +33 %). Undone: every P_os row as ZeRO-OS",
           (("fig7", "60B C1"), ("fig7", "60B C2")), "72411bb", without=(("zero_os_stage1", True),),
           fields=("zero_os_stage1",)),
    Choice("V100 memory 32 GiB", "assumed", "the V100-SXM3-32GB's device memory taken as 32 GiB, where NVML reports "
           "32,480 MiB (0.9 % less; hardware.py); the reserve fitted with it, which was to absorb the difference, "
           "prices only other codes' runs since the paper's artifacts price this engine's memory. Undone: NVML's "
           "32,480 MiB", (), "4ada614", without=(("memory_bytes", 32480 * 2**20),), fields=("memory_bytes",),
           moves=_V100_MEMORY, rows_judged_because="set from the datasheet's 32 GB in the model's first commit, "
           "before any table was scored; the rows it moves are shown without it too"),
    Choice("CUDA context 400 MB", "assumed", "the CUDA context outside the allocator taken as 400 MB, its size with "
           "lazy module loading (CUDA >= 11.7, pytorch/pytorch#109888), on the paper's CUDA 10 stack, which loaded "
           "every kernel at start (over 1000 MB, pytorch/pytorch#107667); not measured on a V100. Undone: 1000 MB",
           (), "c2885d7", without=(("cuda_context_bytes", 1e9),), fields=("cuda_context_bytes",),
           moves=_CONTEXT,
           rows_judged_because="named beside NCCL's buffers in a commit that scored no table; the rows it moves are "
           "shown without it too"),
)  # fmt: skip


def fitted_rows(artifact: str | None = None) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every row some choice was fitted or chosen on, or that carries a term fitted on runs like it ->
    the names of those choices (of `artifact` alone where given)."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for c in CHOICES:
        for row in c.rows + c.carriers:
            if artifact is None or row[0] == artifact:
                out[row] = (*out.get(row, ()), c.name)
    return out


def named_rows(c: Choice) -> tuple[tuple[str, str], ...]:
    """Every row a choice names: fitted or chosen on, carrying it, or moved by an assumed value."""
    return c.rows + c.carriers + c.moves


def reversible(artifact: str) -> dict[str, dict]:
    """The choices of `artifact`'s rows (made on them, carried by them or moved by them) that the model
    can undo: name -> {field: value}."""
    return {c.name: dict(c.without) for c in CHOICES if c.without and any(a == artifact for a, _ in named_rows(c))}


# The fields of Calibration and of a hardware profile no choice sets, and where their values come from.
_DATASHEET = "the GPU's and its node's datasheets and the paper's cluster (paper §6), each cited in hardware.py"
_CALIBRATE = "measured by `zerobench calibrate` on a host (calibrate/machine.py); empty on a datasheet profile"
SOURCED = {
    **dict.fromkeys(("name", "gpu", "peak_flops", "hbm_bw", "gpus_per_node", "intra_bw", "nic_bw", "nics_per_node",
                     "host_bw"), _DATASHEET),
    **dict.fromkeys(("measured", "gemm_table", "kernel_table", "op_overhead_s", "ops_per_layer", "ops_fixed",
                     "concurrency_slowdown", "collectives", "collective_table", "sync_table", "ranks_share_compute",
                     "host_probe"), _CALIBRATE),
}  # fmt: skip


def on_ledger() -> set[str]:
    """The fields some choice sets."""
    return {f for c in CHOICES for f in c.fields}


def unaccounted(fields) -> list[str]:
    """Of `fields`, those neither set by a choice nor SOURCED: each must move no paper row."""
    return [f for f in fields if f not in on_ledger() and f not in SOURCED]


def markdown() -> str:
    """The ledger as docs/perfmodel.md prints it."""
    lines = ["| choice | kind | what | fitted / chosen on | commit |", "|---|---|---|---|---|"]
    for c in CHOICES:
        rows = "; ".join(f"{a} {k}" for a, k in c.rows) or f"no row: {c.rows_judged_because}"
        if c.carriers:
            rows += f"; carried by {len(c.carriers)} rows: " + "; ".join(k for _, k in c.carriers)
        if c.moves:
            rows += f"; moves {len(c.moves)} rows (judged, shown without it): " + "; ".join(
                f"{a} {k}" for a, k in c.moves
            )
        lines.append(f"| `{c.name}` | {c.kind} | {c.what} | {rows} | {c.commit} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
