import pytest

from zerobench.cli import main
from zerobench.engine.config import (
    NOMINAL_BILLIONS,
    PRESETS,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)


@pytest.mark.parametrize("name", sorted(NOMINAL_BILLIONS))
def test_paper_presets_match_their_nominal_size(name):
    cfg = PRESETS[name]
    err = abs(cfg.num_params / 1e9 - NOMINAL_BILLIONS[name]) / NOMINAL_BILLIONS[name]
    # within 5% of the paper's name, or a note says why not (and a note only where it is needed)
    got = f"{cfg.num_params / 1e9:.2f}B vs {NOMINAL_BILLIONS[name]}B, note {cfg.note!r}"
    assert (err > 0.05) == bool(cfg.note), f"{name}: {got}"


def test_num_params_counts_the_built_model():
    import torch

    from zerobench.engine.model import GPT

    for name in ("tiny", "awkward", "cpu-10m"):
        with torch.device("meta"):
            model = GPT(PRESETS[name])
        assert sum(p.numel() for p in model.parameters()) == PRESETS[name].num_params


def test_gpt2_1p5b_count_is_the_papers():
    # paper.md §4.3: 48 × 1600 is 1.47B core (12Lh²) and 1.56B with embeddings
    cfg = preset("gpt-1.5b")
    assert 12 * cfg.layers * cfg.hidden**2 == pytest.approx(1.47e9, rel=0.01)
    assert cfg.num_params == pytest.approx(1.56e9, rel=0.01)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: ModelConfig(layers=2, hidden=100, heads=3), "hidden"),
        (lambda: ModelConfig(layers=0, hidden=64, heads=4), "layers"),
        (lambda: ParallelConfig(dp=0), "dp"),
        (lambda: ParallelConfig(stage=4), "stage"),
        (lambda: ParallelConfig(bucket_bytes=0), "bucket_bytes"),
        (lambda: ParallelConfig(bucket_bytes=-5), "bucket_bytes"),
        (lambda: ParallelConfig(partition_activations=True), "partition_activations"),
        (lambda: ParallelConfig(mp=2).check_model(preset("awkward")), "heads"),
        (lambda: PrecisionConfig(mode="fp8"), "precision"),
        (lambda: TrainConfig(micro_batch=0), "micro_batch"),
        (lambda: TrainConfig(lr=-1.0), "lr"),
        (lambda: preset("gpt-3"), "model"),
    ],
)
def test_bad_config_names_the_field(build, field):
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(f"{field}=")


@pytest.mark.parametrize(
    "argv, field",
    [
        (["run", "--model", "nope"], "model="),
        (["run", "--dp", "0"], "dp="),
        (["run", "--stage", "7"], "stage="),
        (["run", "--bucket-mb", "0"], "bucket_mb="),
        (["run", "--model", "tiny", "--hidden", "65"], "hidden="),
        (["model", "--model", "gpt-8b", "--mp", "16", "--gpus", "40"], "gpus="),
    ],
)
def test_cli_rejects_bad_input_with_exit_2(argv, field, capsys):
    assert main(argv) == 2
    assert field in capsys.readouterr().err


def test_every_field_that_sets_an_attribute_reaches_it():
    """A trial field is one row (trial/fields.py): one that `sets` its attribute reaches the config
    without a line of its own in trial.configs, its `column` is a record column."""
    from zerobench.trial import COLUMNS, configs
    from zerobench.trial.fields import FIELDS, MiB

    built = configs({"model": "tiny", "dp": 2})
    for name, f in FIELDS.items():
        if f.sets:
            if f.choices:
                value = next(c for c in f.choices if c != f.default and c != "auto")
            else:
                value = 2 if f.kind is int else 2.5  # off every default, valid for every such field
            got = f.attribute.of(*configs({"model": "tiny", name: value}))
            assert got == (int(value * MiB) if f.unit else value), name
            assert got != f.attribute.of(*built), name
    assert {f.column for f in FIELDS.values() if f.column} <= set(COLUMNS)


def test_a_field_is_its_config_attribute():
    """The attribute is the flag: a field made from a config dataclass's field takes its name, type,
    default and help from the dataclass (a MiB flag its bytes / MiB), so none is written twice."""
    import dataclasses

    from zerobench.engine.config import ParallelConfig, TrainConfig
    from zerobench.trial.fields import FIELDS, MiB

    micro, bucket = FIELDS["micro_batch"], FIELDS["bucket_mb"]
    assert (micro.attribute.config, micro.attribute.name, micro.kind) == (TrainConfig, "micro_batch", int)
    assert micro.default == TrainConfig().micro_batch and micro.help == "sequences per DP rank per micro-step"
    assert (bucket.attribute.name, bucket.column, bucket.kind) == ("bucket_bytes", "bucket_bytes", float)
    assert bucket.default == ParallelConfig().bucket_bytes / MiB and bucket.help.endswith("(MiB)")
    flagged = {f.attribute.field for f in FIELDS.values() if f.attribute}
    helped = {f for c in (ParallelConfig, TrainConfig) for f in dataclasses.fields(c) if "help" in f.metadata}
    assert helped <= flagged  # no help on the dataclass that no flag reads
