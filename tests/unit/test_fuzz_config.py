"""Config fuzzing: random CLI argument lists and random dataclass fields. Every input is either
accepted as a configuration that obeys the rules, or refused with an error that names the
field — never another exception from deeper down (a TypeError, a ZeroDivisionError, torch)."""

import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobench import cli, trial
from zerobench.engine.config import ConfigError, ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.trial import TrialSpec
from zerobench.trial.errors import REFUSED
from zerobench.trial.fields import FIELDS as TRIAL_FIELDS

EXAMPLES = 550  # per fuzzer; each must try at least MIN_TRIED, so a run fuzzes >= 1000 configurations
MIN_TRIED = 500
FIELD = re.compile(r"^([a-z_]+)=")
FIELDS = {
    f.name
    for cls in (ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig)
    for f in cls.__dataclass_fields__.values()
} | set(TRIAL_FIELDS)

ints = st.one_of(st.integers(-3, 10), st.sampled_from([2**31, 2**64, 10**30]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 1e-9, 0.5, 1.0, 1e300]))
weird = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.tuples(), st.tuples(floats), ints, floats)


def _assert_named(exc: ValueError) -> None:
    m = FIELD.match(str(exc))
    assert m and m.group(1) in FIELDS, f"error does not start with a known field: {exc}"
    assert len(str(exc)) > len(m.group(0)) + 5, f"error states no rule: {exc}"


def _assert_obeys_rules(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, train: TrainConfig):
    """What an accepted configuration must satisfy, stated apart from config.py's own checks."""
    for v in (model.layers, model.hidden, model.heads, model.seq, model.vocab, parallel.dp, parallel.mp):
        assert type(v) is int and v >= 1
    assert model.hidden % model.heads == 0 and model.heads % parallel.mp == 0 and model.hidden % parallel.mp == 0
    assert parallel.stage in (0, 1, 2, 3) and parallel.bucket_bytes >= 1
    assert precision.mode in ("fp32", "bf16", "fp16") and precision.device in ("cpu", "cuda")
    assert math.isfinite(precision.initial_loss_scale) and precision.initial_loss_scale > 0
    assert math.isfinite(train.lr) and train.lr > 0 and math.isfinite(train.eps) and train.eps > 0
    assert len(train.betas) == 2 and all(0 <= b < 1 for b in train.betas)
    assert type(train.seed) is int and 0 <= train.seed < 2**32
    for v in (train.micro_batch, train.grad_accum, train.steps):
        assert type(v) is int and v >= 1


@st.composite
def argv(draw):
    sub = draw(st.sampled_from(["run", "model", "estimate"]))
    args = [sub, "--model", draw(st.sampled_from(["tiny", "awkward", "gpt-1.5b", "nope"]))]
    for name in ("layers", "hidden", "heads", "seq", "vocab", "dp", "mp", "stage", "micro-batch", "grad-accum"):
        if draw(st.booleans()):
            args.append(f"--{name}={draw(ints)}")
    for name in ("steps", "warmup", "seed", "persistence-threshold") + (("gpus",) if sub != "run" else ()):
        if draw(st.integers(0, 3)) == 0:
            args.append(f"--{name}={draw(ints)}")
    for name in ("bucket-mb", "prefetch-mb", "lr"):
        if draw(st.integers(0, 2)) == 0:
            args.append(f"--{name}={draw(floats)!r}")  # = form: argparse takes "-1e+300" for a flag
    if draw(st.booleans()):
        args += ["--precision", draw(st.sampled_from(["fp32", "bf16", "fp16", "fp8"]))]
    if draw(st.integers(0, 3)) == 0:
        args += ["--device", draw(st.sampled_from(["cpu", "cuda", "tpu"]))]
    if draw(st.integers(0, 2)) == 0:
        args += ["--zero-config", draw(st.sampled_from(["C1", "C2", "C3", "C4", "C5"]))]
    for switch in ("checkpoint", "partition", "offload"):
        if draw(st.integers(0, 3)) == 0:
            args.append(f"--{switch}-activations")
    return args


# a generous deadline: the 2 cores here are shared, and a hang is what it must catch
FUZZ = settings(max_examples=EXAMPLES, deadline=5000, database=None, suppress_health_check=[HealthCheck.too_slow])


def _fuzz(strategy, check) -> int:
    """Run `check` on EXAMPLES draws of `strategy` in this test (so the count cannot depend on
    which pytest-xdist worker ran what); returns how many were tried."""
    tried = []

    @FUZZ
    @given(strategy)
    def run(value):
        tried.append(1)
        check(value)

    run()
    return len(tried)


def _check_argv(args):
    parsed = cli.parser().parse_args(args)
    try:
        model, parallel, precision, train = trial.configs(vars(parsed))
        TrialSpec(model, parallel, precision, train)
    except REFUSED as exc:  # the trial's fields (InputError) or the engine's configs (ConfigError)
        _assert_named(exc)
        return
    _assert_obeys_rules(model, parallel, precision, train)


def test_cli_rejects_with_the_field_or_accepts_a_sound_config():
    tried = _fuzz(argv(), _check_argv)
    print(f"\nconfig fuzzing: {tried} CLI argument lists")
    assert tried >= MIN_TRIED


def _kwargs(cls, draw, valid: dict) -> dict:
    """Valid keyword arguments with a few replaced by anything at all."""
    kw = dict(valid)
    for name in draw(st.sets(st.sampled_from(sorted(valid)), max_size=3)):
        kw[name] = draw(weird)
    return kw


_VALID = {
    ModelConfig: dict(layers=2, hidden=64, heads=4, seq=32, vocab=256),
    ParallelConfig: dict(dp=2, mp=2, stage=1, bucket_bytes=1024, prefetch_bytes=1024, persistence_threshold=0),
    PrecisionConfig: dict(mode="fp16", device="cpu", initial_loss_scale=1024.0, loss_scale_window=10),
    TrainConfig: dict(micro_batch=1, grad_accum=1, steps=2, warmup=0, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, seed=1),
}


def _check_dataclasses(data):
    try:
        built = {cls: cls(**_kwargs(cls, data.draw, valid)) for cls, valid in _VALID.items()}
        built[ParallelConfig].check_model(built[ModelConfig])
    except ConfigError as exc:
        _assert_named(exc)
        return
    _assert_obeys_rules(*built.values())


def test_dataclasses_reject_with_the_field_or_accept_a_sound_config():
    tried = _fuzz(st.data(), _check_dataclasses)
    print(f"\nconfig fuzzing: {tried} dataclass combinations")
    assert tried >= MIN_TRIED
