"""A trial's fields, defined once: each is a row of `FIELDS`, from which the rest derive: the
command-line flags of `zerobench run|trace|model|estimate|peers` (zerobench/cli_args.py), the
fields a sheet may set and their JSON schema (zerobench/sweeps/sheets.py,
workflows/schemas/sheet.schema.yaml), the tags of a trial's id, and the record columns a trial's
configuration fills (zerobench/trial/record.py). Defaults are the config dataclasses' own
(zerobench/engine/config.py), as a dataclass is the one definition of a job in torchtitan's config manager.

Adding a trial field is adding a row here (appended: a row's place is its place in trial ids,
whose order the committed records keep). A field that is one configuration attribute names it in
`sets` and is read by `trial.configs` from there; a field with a record `column` is a column of
`trial.TrialRecord` without further ado. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.engine.config import COMPILE, ZERO_CONFIGS, ParallelConfig, TrainConfig
from zerobench.memory import BYTES_PER_PARAM
from zerobench.stages import STAGES

MiB = 2**20  # bytes; the flags take buffer sizes and budgets in MiB
SOURCES = (
    "measured",
    "traced",
    "modelled",
    "emulated",
)  # where a record's numbers come from (zerobench/trial/record.py)
COMMAND = {
    "measured": "run",
    "traced": "trace",
    "modelled": "model",
    "emulated": "emulate",
}  # the command of each source
TRIAL_COMMANDS = ("run", "trace", "model", "estimate", "peers", "emulate")
PREDICTS = ("model", "estimate")  # the performance model's commands
SEARCHES = ("run", "model", "emulate")  # the commands with a batch/depth search (zerobench/sweeps/search.py)
POLICIES = ("listed", "largest_fits")
# the performance model's implementation profiles (perfmodel/implementation.py PROFILES; a test holds
# them equal: the engine imports nothing of the model)
IMPLEMENTATIONS = ("deepspeed-0.3", "efficient")
TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}  # JSON schema's names


@dataclass(frozen=True)
class Field:
    """One trial field. `kind` is int, float, str or bool (a switch, off by default); `tag` its
    prefix in a trial id ("" for the bare value, None for none); `flag` False for a sheet-only
    field; `commands` those that take its flag; `schema` further JSON-schema constraints on a
    sheet's value; `column` (record column, the configuration attribute that fills it); `sets`
    the configuration attribute ("train.lr", "parallel.bucket_bytes") the value is, as given or,
    with `unit`, times it (MiB flags into bytes): `trial.configs` reads every such field without a
    line of its own."""

    name: str
    kind: type
    help: str
    group: str
    default: object = None
    tag: str | None = None
    flag: bool = True
    commands: tuple[str, ...] = TRIAL_COMMANDS
    choices: tuple | None = None
    schema: dict | None = None
    column: tuple[str, str] | None = None
    sets: str | None = None
    unit: int | None = None

    def __post_init__(self):
        if self.kind is bool and self.default is None:
            object.__setattr__(self, "default", False)  # a switch is off unless given

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def json_schema(self) -> dict:
        """The JSON schema of a sheet's value of this field."""
        out = {"enum": list(self.choices)} if self.choices else {"type": TYPES[self.kind]}
        return {**out, **(self.schema or {}), "description": self.help}


_P, _T = ParallelConfig, TrainConfig
_POSITIVE = {"minimum": 1}
_NAME = {"pattern": "^[a-z0-9.-]+$"}
_POLICY = "largest_fits: the largest {} that fits, up to the listed one (bisection on OOM)"

# In trial-id order (see above). Groups: the flags' sections in `--help`.
FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("model", str, "preset name (see `zerobench presets`)", "model", "tiny", "", schema=_NAME,
          column=("model", "model.name")),
    Field("layers", int, "override the preset's layers", "model", tag="L", schema=_POSITIVE,
          column=("layers", "model.layers")),
    Field("hidden", int, "override the preset's hidden", "model", tag="h", schema=_POSITIVE,
          column=("hidden", "model.hidden")),
    Field("heads", int, "override the preset's heads", "model", tag="a", schema=_POSITIVE,
          column=("heads", "model.heads")),
    Field("seq", int, "override the preset's seq", "model", tag="s", schema=_POSITIVE, column=("seq", "model.seq")),
    Field("vocab", int, "override the preset's vocab", "model", tag="v", schema=_POSITIVE,
          column=("vocab", "model.vocab")),
    Field("gpus", int, "world size: dp = gpus / mp (not a multiple: infeasible)", "parallel", tag="g",
          commands=("run", "trace", "emulate", *PREDICTS), schema=_POSITIVE),
    Field("dp", int, "data-parallel degree N_d (default 1, or gpus/mp)", "parallel", tag="dp", schema=_POSITIVE,
          column=("dp", "parallel.dp")),
    Field("mp", int, "tensor model-parallel degree N_m", "parallel", _P.mp, "mp", schema=_POSITIVE,
          column=("mp", "parallel.mp"), sets="parallel.mp"),
    Field("stage", int, "ZeRO-DP stage 0-3 (0 = plain DP)", "parallel", tag="z", schema={"enum": list(STAGES)},
          column=("stage", "parallel.stage")),
    Field("precision", str, "fp32, bf16 or fp16 (16-bit = 2+2+12 bytes/param); default fp16, or fp32 for steps "
          "computed on a cpu", "train", tag="", schema={"enum": list(BYTES_PER_PARAM)},
          column=("precision", "precision.mode")),
    Field("micro_batch", int, "sequences per DP rank per micro-step", "train", _T.micro_batch, "b", schema=_POSITIVE,
          column=("micro_batch", "train.micro_batch"), sets="train.micro_batch"),
    Field("grad_accum", int, "micro-batches per step", "train", _T.grad_accum, "ga", schema=_POSITIVE,
          column=("grad_accum", "train.grad_accum"), sets="train.grad_accum"),
    Field("checkpoint_activations", bool, "one checkpoint per block", "parallel", tag="ckpt",
          column=("checkpoint_activations", "parallel.checkpoint_activations")),
    Field("bucket_mb", float, "C_B: fused buffer size in MiB", "parallel", _P.bucket_bytes / MiB, "cb",
          schema={"exclusiveMinimum": 0}, column=("bucket_bytes", "parallel.bucket_bytes"),
          sets="parallel.bucket_bytes", unit=MiB),
    Field("steps", int, "timed steps", "train", _T.steps, "n", schema=_POSITIVE, column=("steps", "train.steps"),
          sets="train.steps"),
    Field("warmup", int, "untimed steps before timing", "train", _T.warmup, "w", schema={"minimum": 0},
          sets="train.warmup"),
    Field("seed", int, "seed of the weights and the synthetic batches", "train", _T.seed, "seed",
          schema={"minimum": 0}, sets="train.seed"),
    Field("data", str, "synthetic, or a text file / shipped corpus (byte tokens)", "run", "synthetic", "",
          commands=("run", "emulate"), schema={"pattern": "^[A-Za-z0-9_.-]+$"}),
    Field("mem_cap_mb", float, "per-rank budget (MiB); exceeding it is status oom (emulate on cuda: the "
          "caching allocator's limit)", "run", tag="cap", commands=("run", "emulate"), schema={"exclusiveMinimum": 0}),
    Field("hardware", str, "performance-model profile: v100-32gb-dgx2, a100-80gb, h100-80gb, h200-141gb, or a "
          "`zerobench calibrate` JSON path/name", "hardware", "v100-32gb-dgx2", "", commands=PREDICTS,
          schema={"pattern": "^[a-z0-9-]+$"}),
    Field("zero_config", str, "the paper's C1-C5 (Table 3; sets stage and ZeRO-R)", "parallel", tag="",
          choices=tuple(sorted(ZERO_CONFIGS))),
    Field("partition_activations", bool, "P_a: split checkpoints over MP", "parallel", tag="pa",
          column=("partition_activations", "parallel.partition_activations")),
    Field("offload_activations", bool, "P_a+cpu: checkpoints to host", "parallel", tag="pacpu",
          column=("offload_activations", "parallel.offload_activations")),
    Field("contiguous_buffers", bool, "M_D: preallocated contiguous buffers", "parallel", tag="md",
          column=("contiguous_buffers", "parallel.contiguous_buffers")),
    Field("micro_batch_policy", str, _POLICY.format("micro_batch"), "search", "listed", "bpol-", commands=SEARCHES,
          choices=POLICIES),
    Field("layers_policy", str, _POLICY.format("layers"), "search", "listed", "Lpol-", commands=SEARCHES,
          choices=POLICIES),
    Field("zero_os", bool, "model P_os as ZeRO-OS (the paper's first version: no gradient copy)", "hardware",
          tag="zeroos", commands=("model",)),
    Field("attention", str, "attention kernel: s² scores + softmax pass (the paper's code; default of `model`) or "
          "flash-style (today's codes; default of `estimate`)", "hardware", tag="attn-", commands=PREDICTS,
          choices=("materialized", "fused")),
    Field("states_only", bool, "build the engine and count its model states, no step", "trace", tag="states",
          commands=("trace",)),
    Field("allocator", str, "host allocator on CPU (runtime/allocator.py); auto: jemalloc when installed", "run",
          "system", "", commands=("run", "calibrate"), choices=("auto", "jemalloc", "system")),
    Field("label", str, "the point's name in the artifact's table (e.g. \"Fig 2 ZeRO 8B\")", "sheet", flag=False),
    Field("repeat", int, "the same measured trial run again (1, 2, ...): its own record, for a table that takes "
          "the median over the runs", "sheet", tag="rep", flag=False, schema=_POSITIVE),
    Field("prefetch_mb", float, "stage 3: gathered bytes in flight (MiB)", "parallel", _P.prefetch_bytes / MiB,
          "pf", schema={"exclusiveMinimum": 0}, sets="parallel.prefetch_bytes", unit=MiB),
    Field("max_live_mb", float, "stage 3: gathered bytes alive at once (MiB)", "parallel", _P.max_live_bytes / MiB,
          "live", schema={"exclusiveMinimum": 0}, sets="parallel.max_live_bytes", unit=MiB),
    Field("persistence_threshold", int, "stage 3: keep tensors this small whole (elements)", "parallel",
          _P.persistence_threshold, "pt", schema={"minimum": 0}, sets="parallel.persistence_threshold"),
    Field("reuse_mb", float, "stage 3: keep a bucket gathered when its next use is less than this many MiB of "
          "gathers ahead (0: release all, the paper's 3Ψ)", "parallel", _P.reuse_bytes / MiB, "reuse",
          schema={"minimum": 0}, sets="parallel.reuse_bytes", unit=MiB),
    Field("lr", float, "Adam's learning rate", "train", _T.lr, "lr", schema={"exclusiveMinimum": 0}, sets="train.lr"),
    Field("clip_norm", float, "global gradient-norm clip; 0 disables it", "train", _T.clip_norm, "clip",
          schema={"minimum": 0}, sets="train.clip_norm"),
    Field("device", str, "cpu (gloo) or cuda (NCCL); default cpu, and cuda's semantics for a trace (it computes "
          "nothing, so it traces the GPUs the paper ran on); the workflow's config sets it for every measured or "
          "emulated trial unless the sheet's trial sets its own", "train", None, "",
          column=("device", "precision.device")),
    Field("gpus_per_node", int, "override the profile's node size", "hardware", tag="gpn", commands=PREDICTS,
          schema=_POSITIVE),
    Field("weight_decay", float, "AdamW's decoupled weight decay", "train", _T.weight_decay, "wd",
          schema={"minimum": 0}, sets="train.weight_decay"),
    Field("timeout", float, "seconds a collective (or a step) may wait", "run", 1800.0, "to",
          commands=("run", "peers"), schema={"exclusiveMinimum": 0}),
    Field("compile", str, "torch.compile each block's compute (zerobench/engine/compile.py); auto: on for cuda, off "
          "for cpu", "run", _T.compile, "compile-", commands=("run", "emulate"), choices=COMPILE,
          column=("compile", "train.compile"), sets="train.compile"),
    Field("rank", int, "the rank of the dp × mp world this process runs", "emulate", 0, "rk", commands=("emulate",),
          schema={"minimum": 0}),
    Field("cluster", str, "the hardware profile whose network prices the collectives (default: the device's own: "
          "its GPU's profile, or calibrated-cpu)", "emulate", tag="on-", commands=("emulate",),
          schema={"pattern": "^[a-z0-9-]+$"}),
    Field("implementation", str, "how the ZeRO code issues its collectives (perfmodel/implementation.py); default "
          "efficient, this engine", "hardware", tag="impl-", commands=PREDICTS, choices=IMPLEMENTATIONS),
)}  # fmt: skip
SHEET_FIELDS = tuple(name for name, f in FIELDS.items() if f.tag is not None or not f.flag)


def takes(command: str, name: str) -> bool:
    """Whether `command` takes the field `name`'s flag."""
    f = FIELDS[name]
    return f.flag and command in f.commands


def defaults(command: str) -> dict:
    """Every field `command` takes, at its default: a trial's mapping before its own values."""
    return {name: f.default for name, f in FIELDS.items() if takes(command, name)}
