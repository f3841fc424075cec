"""A trial's fields, defined once: each is a row of `FIELDS`, from which the rest derive: the
command-line flags of `zerobench run|trace|model|estimate|peers` (zerobench/cli_args.py), the
fields a sheet may set and their JSON schema (zerobench/sweeps/sheets.py,
workflows/schemas/sheet.schema.yaml), the tags of a trial's id, and the record columns a trial's
configuration fills (zerobench/trial/record.py).

A field that is a configuration attribute is made from the config dataclass's own field
(`of(attributes(TrainConfig).micro_batch, ...)`, zerobench/engine/config.py): the attribute is the
flag, as in torchtitan's config manager, so its name, type, default and help (the field's
`metadata`) are written once, on the dataclass, and a renamed attribute fails here, at import. Such
a field either sets the attribute (`trial.configs` reads every one without a line of its own) or, where
`configs` has a rule of its own (the preset's shape, dp from gpus, the stage from a C1-C5), only names
the attribute its record column reads.

Adding a trial field is adding a row here (appended: a row's place is its place in trial ids,
whose order the committed records keep). No torch import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

from zerobench.engine.config import (
    COMPILE,
    PAPER_BUCKET,
    ZERO_CONFIGS,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)
from zerobench.memory import BYTES_PER_PARAM
from zerobench.stages import STAGES
from zerobench.trial.errors import InputError

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
SEARCHES = ("run", "model", "emulate")  # the commands with a batch/depth search (zerobench/trial/policy.py)
POLICIES = ("listed", "largest_fits")
# the performance model's implementation profiles (perfmodel/implementation.py PROFILES; a test holds
# them equal: the engine imports nothing of the model)
IMPLEMENTATIONS = ("deepspeed-0.3", "deepspeed-zero-2020", "deepspeed-zero-os-2020", "efficient",
                   "megatron-lm-2019", "pytorch-ddp-2019")  # fmt: skip
TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}  # JSON schema's names


@dataclass(frozen=True)
class Attribute:
    """One attribute of a config dataclass: the class and its `dataclasses.Field`."""

    config: type
    field: dataclasses.Field

    @property
    def name(self) -> str:
        return self.field.name

    def of(self, *configs) -> object:
        """This attribute's value in whichever of `configs` is an instance of its class."""
        return getattr(next(c for c in configs if type(c) is self.config), self.name)


def attributes(config: type) -> SimpleNamespace:
    """`config`'s attributes, each by its own name: `attributes(TrainConfig).micro_batch`."""
    return SimpleNamespace(**{f.name: Attribute(config, f) for f in dataclasses.fields(config)})


@dataclass(frozen=True)
class Field:
    """One trial field. `kind` is int, float, str or bool (a switch, off by default); `tag` its
    prefix in a trial id ("" for the bare value, None for none); `flag` False for a sheet-only
    field; `commands` those that take its flag; `schema` further JSON-schema constraints on a
    sheet's value; `attribute` the configuration attribute the field is (made by `of`); `sets`
    whether the value is that attribute's, as given or, with `unit`, times it (MiB flags into
    bytes); `column` the record column it fills, read from the attribute; `names` the words a sheet
    may give for a value (`bucket_mb: paper`), each resolved to it by `resolved`."""

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
    attribute: Attribute | None = None
    sets: bool = False
    column: str | None = None
    unit: int | None = None
    names: dict | None = None

    def __post_init__(self):
        if self.kind is bool and self.default is None:
            object.__setattr__(self, "default", False)  # a switch is off unless given

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def json_schema(self) -> dict:
        """The JSON schema of a sheet's value of this field."""
        out = {"enum": list(self.choices)} if self.choices else {"type": TYPES[self.kind]}
        out = {**out, **(self.schema or {})}
        if self.names:
            out = {"anyOf": [out, {"enum": list(self.names)}]}
        return {**out, "description": self.help}


_GROUPS = {ModelConfig: "model", ParallelConfig: "parallel", PrecisionConfig: "train", TrainConfig: "train"}
_KINDS = {"int": int, "float": float, "str": str, "bool": bool}  # a dataclass field's type, as annotated
_UNSET = object()


def of(
    attribute: Attribute,
    tag: str | None,
    *,
    sets: bool = True,
    column: bool = False,
    mib: bool = False,
    name: str | None = None,
    help: str | None = None,
    default: object = _UNSET,
    **more,
) -> Field:
    """The field that is `attribute`: named as the attribute (`<name>_mb` with `mib`: the flag in
    MiB, the attribute in bytes), typed, defaulted (in MiB with `mib`) and helped as the dataclass
    says, in its config's group; `sets` False for an attribute `trial.configs` sets by a rule of its
    own, `column` True for one a record column reads. `name`, `help` and `default` are for a flag
    that says more than its attribute (a preset's override, a default of its own)."""
    f = attribute.field
    unit = MiB if mib else None
    if default is _UNSET:
        default = f.default / MiB if mib else f.default
    return Field(
        name or (f.name.removesuffix("_bytes") + "_mb" if mib else f.name),
        float if mib else _KINDS[f.type],
        help or f.metadata["help"] + (" (MiB)" if mib else ""),
        more.pop("group", _GROUPS[attribute.config]),
        default,
        tag,
        attribute=attribute,
        sets=sets,
        column=(f.name if mib else name or f.name) if column else None,
        unit=unit,
        **more,
    )


_M, _P, _R, _T = (attributes(c) for c in (ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig))
_POSITIVE = {"minimum": 1}
_NAME = {"pattern": "^[a-z0-9.-]+$"}
_POLICY = "largest_fits: the largest {} that fits, up to the listed one (bisection on OOM)"


def _shape(attribute: Attribute, tag: str) -> Field:
    """A preset's shape attribute, overridden by its flag (`trial.configs` applies the overrides)."""
    return of(
        attribute,
        tag,
        sets=False,
        column=True,
        help=f"override the preset's {attribute.name}",
        default=None,
        schema=_POSITIVE,
    )


# In trial-id order (see above). Groups: the flags' sections in `--help`.
FIELDS: dict[str, Field] = {f.name: f for f in (
    of(_M.name, "", sets=False, column=True, name="model", help="preset name (see `zerobench presets`)",
       default="tiny", schema=_NAME),
    _shape(_M.layers, "L"),
    _shape(_M.hidden, "h"),
    _shape(_M.heads, "a"),
    _shape(_M.seq, "s"),
    _shape(_M.vocab, "v"),
    Field("gpus", int, "world size: dp = gpus / mp (not a multiple: infeasible)", "parallel", tag="g",
          commands=("run", "trace", "emulate", *PREDICTS), schema=_POSITIVE),
    of(_P.dp, "dp", sets=False, column=True, help="data-parallel degree N_d (default 1, or gpus/mp)", default=None,
       schema=_POSITIVE),
    of(_P.mp, "mp", column=True, schema=_POSITIVE),
    of(_P.stage, "z", sets=False, column=True, default=None, schema={"enum": list(STAGES)}),
    of(_R.mode, "", sets=False, column=True, name="precision", help="fp32, bf16 or fp16 (16-bit = 2+2+12 "
       "bytes/param); default fp16, or fp32 for steps computed on a cpu", default=None,
       schema={"enum": list(BYTES_PER_PARAM)}),
    of(_T.micro_batch, "b", column=True, schema=_POSITIVE),
    of(_T.grad_accum, "ga", column=True, schema=_POSITIVE),
    of(_P.checkpoint_activations, "ckpt", sets=False, column=True),
    of(_P.bucket_bytes, "cb", mib=True, column=True, schema={"exclusiveMinimum": 0},
       names={"paper": PAPER_BUCKET / MiB}),
    of(_T.steps, "n", column=True, schema=_POSITIVE),
    of(_T.warmup, "w", schema={"minimum": 0}),
    of(_T.seed, "seed", schema={"minimum": 0}),
    Field("data", str, "synthetic, or a text file / shipped corpus (byte tokens)", "run", "synthetic", "",
          commands=("run", "emulate"), schema={"pattern": "^[A-Za-z0-9_.-]+$"}),
    Field("mem_cap_mb", float, "per-rank budget (MiB); exceeding it is status oom (emulate on cuda: the "
          "caching allocator's limit)", "run", tag="cap", commands=("run", "emulate"), schema={"exclusiveMinimum": 0}),
    Field("hardware", str, "performance-model profile: v100-32gb-dgx2, a100-80gb, h100-80gb, h200-141gb, or a "
          "`zerobench calibrate` JSON path/name", "hardware", "v100-32gb-dgx2", "", commands=PREDICTS,
          schema={"pattern": "^[a-z0-9-]+$"}),
    Field("zero_config", str, "the paper's C1-C5 (Table 3; sets stage and ZeRO-R)", "parallel", tag="",
          choices=tuple(sorted(ZERO_CONFIGS))),
    of(_P.partition_activations, "pa", sets=False, column=True),
    of(_P.offload_activations, "pacpu", sets=False, column=True),
    of(_P.contiguous_buffers, "md", sets=False, column=True),
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
    of(_P.prefetch_bytes, "pf", mib=True, schema={"exclusiveMinimum": 0}),
    of(_P.max_live_bytes, "live", mib=True, schema={"exclusiveMinimum": 0}),
    of(_P.persistence_threshold, "pt", schema={"minimum": 0}),
    of(_P.reuse_bytes, "reuse", mib=True, schema={"minimum": 0}),
    of(_T.lr, "lr", schema={"exclusiveMinimum": 0}),
    of(_T.clip_norm, "clip", schema={"minimum": 0}),
    of(_R.device, "", sets=False, column=True, help="cpu (gloo) or cuda (NCCL); default cpu, and cuda's semantics "
       "for a trace (it computes nothing, so it traces the GPUs the paper ran on); the workflow's config sets it "
       "for every measured or emulated trial unless the sheet's trial sets its own", default=None),
    Field("gpus_per_node", int, "override the profile's node size", "hardware", tag="gpn", commands=PREDICTS,
          schema=_POSITIVE),
    of(_T.weight_decay, "wd", schema={"minimum": 0}),
    Field("timeout", float, "seconds a collective (or a step) may wait", "run", 1800.0, "to",
          commands=("run", "peers"), schema={"exclusiveMinimum": 0}),
    of(_T.compile, "compile-", column=True, group="run", commands=("run", "emulate"), choices=COMPILE),
    Field("rank", int, "the rank of the dp × mp world this process runs", "emulate", 0, "rk", commands=("emulate",),
          schema={"minimum": 0}),
    Field("cluster", str, "the hardware profile whose network prices the collectives (default: the device's own: "
          "its GPU's profile, or calibrated-cpu)", "emulate", tag="on-", commands=("emulate",),
          schema={"pattern": "^[a-z0-9-]+$"}),
    Field("implementation", str, "the code the trial is priced as: its collectives and, for the paper's codes, their "
          "memory and overlaps (perfmodel/implementation.py); default efficient, this engine", "hardware",
          tag="impl-", commands=PREDICTS, choices=IMPLEMENTATIONS),
)}  # fmt: skip
SHEET_FIELDS = tuple(name for name, f in FIELDS.items() if f.tag is not None or not f.flag)


def takes(command: str, name: str) -> bool:
    """Whether `command` takes the field `name`'s flag."""
    f = FIELDS[name]
    return f.flag and command in f.commands


def defaults(command: str) -> dict:
    """Every field `command` takes, at its default: a trial's mapping before its own values."""
    return {name: f.default for name, f in FIELDS.items() if takes(command, name)}


def resolved(values: dict) -> dict:
    """A trial's field values with each named value (`bucket_mb: paper`) replaced by what it names;
    a word the field does not know is refused, naming the field."""
    out = dict(values)
    for name, value in values.items():
        names = FIELDS[name].names if name in FIELDS else None
        if names and isinstance(value, str):
            if value not in names:
                raise InputError(f"{name}={value!r}: must be a number or one of {list(names)}")
            out[name] = names[value]
    return out
