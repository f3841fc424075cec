"""Sharded checkpoints: exact resume, resharding across dp and stages, export to a plain state_dict,
atomic writes and refusal of damaged checkpoints. Threaded process groups except where noted."""

import math
import shutil

import pytest
import torch

from tests.engine_cases import spec_for
from tests.worlds import spawned, threaded
from zerobench import cli, record_files
from zerobench.engine.config import preset
from zerobench.engine.model import GPT
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.runtime import snapshot
from zerobench.runtime.snapshot import CheckpointError
from zerobench.runtime.train import build_engine, train_steps

STATES = ("master", "exp_avg", "exp_avg_sq")


def _spec(dp, stage, precision="fp32", mp=1, model="tiny"):
    """Global batch 4 whatever dp is, so layouts are comparable."""
    return spec_for(model, precision=precision, dp=dp, mp=mp, stage=stage, micro_batch=4 // dp, steps=3)


def _engine(spec):
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    return build_engine(spec, ctx, Comms(), torch.device("cpu")), ctx


def _session(rank, spec, load_from, save_to, steps, then_save=None):
    """One process group's life: build, optionally load, train `steps`, optionally save."""
    engine, ctx = _engine(spec)
    first, meta = 0, None
    if load_from:
        meta = snapshot.load(engine, load_from)
        first = meta["data_position"]
        if then_save:  # the state exactly as loaded, for comparison with what was saved
            snapshot.save(engine, meta["step"], first, then_save)
    losses = train_steps(engine, spec, ctx, steps, first_step=first)
    if save_to:
        snapshot.save(engine, first + steps, first + steps, save_to)
    scaler = engine.scaler
    return {
        "params": engine.full_parameters(),
        "losses": losses,
        "scaler": (scaler.scale, scaler.clean_steps, scaler.skipped),
        "adam_step": float(engine.optimizer.steps[0]),
        "meta": meta,
    }


def _assert_bitwise(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    "stage, precision",
    [(0, "fp32"), (1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "fp16"), (1, "bf16")],
)
def test_resume_is_exact(stage, precision, tmp_path):
    """6 steps straight == 3 steps, save, new process group, load, 3 steps — to the bit."""
    spec = _spec(2, stage, precision)
    straight = threaded(2, _session, spec, None, None, 6)
    threaded(2, _session, spec, None, tmp_path / "ck", 3)
    resumed = threaded(2, _session, spec, tmp_path / "ck", None, 3)
    for r in range(2):
        _assert_bitwise(resumed[r]["params"], straight[r]["params"])
        assert resumed[r]["losses"] == straight[r]["losses"][3:]
        assert resumed[r]["scaler"] == straight[r]["scaler"]
        assert resumed[r]["adam_step"] == straight[r]["adam_step"] == 6.0
    meta = resumed[0]["meta"]
    assert (meta["step"], meta["data_position"], meta["layout"]["dp"], meta["layout"]["stage"]) == (3, 3, 2, stage)


RESHARD = [
    (4, 2, 2, 2),
    (4, 1, 1, 0),
    (2, 2, 4, 1),
    (2, 0, 4, 2),
    (1, 1, 2, 2),
    (4, 3, 2, 1),
    (2, 1, 2, 3),
]


@pytest.mark.parametrize("save_dp, save_stage, load_dp, load_stage", RESHARD)
def test_reshard_across_dp_and_stage(save_dp, save_stage, load_dp, load_stage, tmp_path):
    """Saved at one (dp, stage), loaded at another: the optimizer state by parameter is bit-identical
    and training continues as the run that kept its layout (losses equal up to the order of fp32
    sums, which differs with dp)."""
    before, after = _spec(save_dp, save_stage, model="awkward"), _spec(load_dp, load_stage, model="awkward")
    a, b = tmp_path / "saved", tmp_path / "reloaded"
    threaded(save_dp, _session, before, None, a, 3)
    kept = _world(save_dp, _session, before, a, None, 3)
    moved = _world(load_dp, _session, after, a, None, 3, b)
    for state in STATES:
        _assert_bitwise(snapshot.export_state_dict(b, state), snapshot.export_state_dict(a, state))
    assert moved[0]["adam_step"] == kept[0]["adam_step"] == 6.0
    assert moved[0]["meta"]["rng_restored"] == (save_dp == load_dp)
    # each rank's loss is over its own samples; compare the global mean
    mean = lambda out: [sum(r["losses"][i] for r in out) / len(out) for i in range(3)]  # noqa: E731
    assert mean(moved) == pytest.approx(mean(kept), rel=1e-6)


def _world(n, fn, *args):
    return [fn(0, *args)] if n == 1 else threaded(n, fn, *args)


def test_export_loads_into_the_unsharded_model(tmp_path):
    spec = _spec(2, 2, "bf16")
    out = threaded(2, _session, spec, None, tmp_path / "ck", 2)
    sd = snapshot.export_state_dict(tmp_path / "ck")
    model = GPT(preset("tiny"))
    model.load_state_dict(sd, strict=True)  # every key, every shape
    # the export is the fp32 master; the engine's bf16 weights are its rounding
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(p.detach().to(torch.bfloat16).float(), out[0]["params"][name]), name
    with pytest.raises(ValueError, match="state='grads'"):
        snapshot.export_state_dict(tmp_path / "ck", "grads")


def test_export_matches_fp32_engine_bitwise(tmp_path):
    out = threaded(2, _session, _spec(2, 1), None, tmp_path / "ck", 2)
    _assert_bitwise(snapshot.export_state_dict(tmp_path / "ck"), out[0]["params"])


# -- damaged checkpoints ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A stage-2, dp = 2 checkpoint (one shard file per rank)."""
    d = tmp_path_factory.mktemp("ck") / "good"
    threaded(2, _session, _spec(2, 2), None, d, 1)
    return d


def _damaged(saved, tmp_path, damage):
    d = tmp_path / "ck"
    shutil.copytree(saved, d)
    damage(d)
    return d


def _load_single(d, model="tiny"):
    spec = _spec(1, 1, model=model)
    engine, _ = _engine(spec)
    return snapshot.load(engine, d)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "rank00001.pt").unlink(), r"rank00001\.pt: missing"),
        (lambda d: _truncate(d / "rank00001.pt"), r"rank00001\.pt: \d+ bytes, the manifest says \d+"),
        (lambda d: _flip_byte(d / "rank00000.pt"), r"rank00000\.pt: SHA-256 .* does not match"),
        (lambda d: (d / "manifest.json").unlink(), r"manifest\.json: missing"),
        (lambda d: (d / "manifest.json").write_text("{"), r"manifest\.json: not valid JSON"),
        (lambda d: shutil.copy(d / "rank00000.pt", d / "rank00001.pt"), r"rank00001\.pt: (\d+ bytes|SHA-256)"),
        (lambda d: _drop_entry(d), r"rank00001\.pt.*leaves \[\d+, \d+\) uncovered|covered up to element"),
    ],
    ids=["missing", "truncated", "corrupted", "no-manifest", "bad-manifest", "swapped", "gap"],
)
def test_damaged_checkpoint_is_refused(saved, tmp_path, damage, message):
    d = _damaged(saved, tmp_path, damage)
    with pytest.raises(CheckpointError, match=message):
        _load_single(d)
    with pytest.raises(CheckpointError, match=message):
        snapshot.export_state_dict(d)


def _drop_entry(d):
    import json

    m = json.loads((d / "manifest.json").read_text())
    m["files"][1]["index"] = m["files"][1]["index"][1:]
    (d / "manifest.json").write_text(json.dumps(m))


def test_wrong_model_is_refused(saved):
    with pytest.raises(CheckpointError, match=r"parameter \S+ has shape \[.*\] in the checkpoint, \[.*\] in the model"):
        _load_single(saved, model="awkward")


def _load_catching(rank, spec, d):
    engine, _ = _engine(spec)
    try:
        snapshot.load(engine, d)
    except CheckpointError as exc:
        return str(exc)
    return None


def test_every_rank_refuses_when_one_rank_finds_damage(saved, tmp_path):
    """At stage 2, dp = 2 rank 0 never reads rank 1's file; it must refuse all the same."""
    d = _damaged(saved, tmp_path, lambda d: _flip_byte(d / "rank00001.pt"))
    errors = threaded(2, _load_catching, _spec(2, 2), d)
    assert "rank00001.pt: SHA-256" in errors[1]
    assert "another rank rejected" in errors[0]


def test_save_is_atomic(tmp_path, monkeypatch):
    """A save that dies before its manifest leaves only `<dir>.partial`, which never loads, and an
    older checkpoint of the same name survives it intact."""
    spec = _spec(1, 1)
    d = tmp_path / "ck"
    _session(0, spec, None, d, 1)
    good = snapshot.export_state_dict(d)
    engine, ctx = _engine(spec)
    train_steps(engine, spec, ctx, 2)

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(snapshot.json, "dumps", crash)
    with pytest.raises(OSError, match="disk full"):
        snapshot.save(engine, 2, 2, d)
    monkeypatch.undo()
    assert (tmp_path / "ck.partial").exists()
    _assert_bitwise(snapshot.export_state_dict(d), good)
    shutil.rmtree(d)
    with pytest.raises(CheckpointError, match=r"no such checkpoint directory .*ck\.partial is an unfinished save"):
        _load_single(d)
    snapshot.save(engine, 2, 2, d)  # a later save clears the leftover
    assert not (tmp_path / "ck.partial").exists()
    assert snapshot.read_manifest(d)["step"] == 2


def test_cli_save_and_resume(tmp_path, capsys):
    """`zerobench run --save` then `--resume`: the resumed losses are those of the straight run.
    Each step (warm-up and timed) logs one line on stderr, with the loss the record keeps."""
    base = ["run", "--model", "tiny", "--micro-batch", "2", "--warmup", "1"]
    assert cli.main([*base, "--steps", "4", "--out", str(tmp_path / "straight.json")]) == 0
    lines = [line.split() for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [int(w[1]) for w in lines] == [0, 1, 2, 3, 4]
    logged = [float(w[3]) for w in lines[1:]]
    assert logged == pytest.approx(record_files.read_record(tmp_path / "straight.json")["losses"], abs=1e-4)
    assert all(w[5] == "s/step" and w[7] == "tokens/s" and w[8:10] == ["peak", "RSS"] for w in lines)
    assert cli.main([*base, "--steps", "1", "--save", str(tmp_path / "ck"), "--out", str(tmp_path / "a.json")]) == 0
    assert snapshot.read_manifest(tmp_path / "ck")["step"] == 2  # warm-up + timed steps
    assert cli.main([*base, "--steps", "2", "--resume", str(tmp_path / "ck"), "--out", str(tmp_path / "b.json")]) == 0
    straight, resumed = (record_files.read_record(tmp_path / f) for f in ("straight.json", "b.json"))
    assert resumed["losses"] == straight["losses"][2:]
    # a damaged checkpoint is an error record naming the file
    (tmp_path / "ck" / "rank00000.pt").write_bytes(b"")
    assert cli.main([*base, "--resume", str(tmp_path / "ck"), "--out", str(tmp_path / "c.json")]) == 1
    assert "rank00000.pt: 0 bytes" in record_files.read_record(tmp_path / "c.json")["error"]


# -- dp x mp and real gloo ------------------------------------------------------------------------
def test_reshard_dp_with_mp(tmp_path):
    """dp 2 × mp 2 saved, loaded at dp 1 × mp 2: state bit-identical; mp must not change."""
    a, b = tmp_path / "a", tmp_path / "b"
    threaded(4, _session, _spec(2, 2, mp=2), None, a, 2)
    threaded(2, _session, _spec(1, 1, mp=2), a, None, 1, b)
    m_a, m_b = snapshot.read_manifest(a), snapshot.read_manifest(b)
    assert m_a["shapes"] == m_b["shapes"]
    for mp_rank in ("0", "1"):
        for state in STATES:
            _assert_bitwise(_mp_state(a, m_a, mp_rank, state), _mp_state(b, m_b, mp_rank, state))
    with pytest.raises(CheckpointError, match="saved at mp=2, cannot load at mp=1"):
        _load_single(a)
    with pytest.raises(CheckpointError, match="export needs mp=1"):
        snapshot.export_state_dict(a)


def _mp_state(d, manifest, mp_rank, state):
    """{name: flat tensor} of one MP rank's state, assembled straight from the shard files."""
    out = {name: torch.empty(math.prod(shape)) for name, shape in manifest["shapes"][mp_rank].items()}
    for f in manifest["files"]:
        if str(f["mp_rank"]) == mp_rank:
            shard = torch.load(d / f["file"], weights_only=True)
            pos = 0
            for name, s, e in f["index"]:
                out[name][s:e] = shard[state][pos : pos + e - s]
                pos += e - s
    return out


def _rng_draw(rank, spec, load_from, save_to, steps):
    out = _session(rank, spec, load_from, save_to, steps)
    out["draw"] = torch.rand(4)
    return out


@pytest.mark.ci
@pytest.mark.slow
def test_resume_on_real_gloo_restores_rng(tmp_path):
    """Separate gloo processes: the RNG of each rank continues where it was saved.

    Two spawned gloo worlds in turn (about 12 s); resuming is tested in process above, so it runs in
    CI only."""
    spec = _spec(2, 2)
    first = spawned(2, _rng_draw, spec, None, tmp_path / "ck", 2)
    second = spawned(2, _rng_draw, spec, tmp_path / "ck", None, 0)
    for r in range(2):
        assert torch.equal(first[r]["draw"], second[r]["draw"])
        _assert_bitwise(first[r]["params"], second[r]["params"])
