import pytest
import torch

from zerobench.engine.zero.optimizer import coalesce
from zerobench.engine.zero.partition import FlatLayout

SHAPES = [("a", (3, 5)), ("b", (7,)), ("c", (4, 4)), ("d", (1,)), ("e", (10,))]


@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("bucket", [1, 16, 25, 1000])
def test_buckets_tile_the_buffer_and_shards_are_equal(nd, bucket):
    lay = FlatLayout(SHAPES, nd, bucket)
    assert lay.numel == 15 + 7 + 16 + 1 + 10
    offset = 0
    for b in lay.buckets:
        assert b.start == offset and b.padded % nd == 0 and b.padded - b.numel < nd
        offset += b.padded
        # chunks of all ranks tile the bucket
        assert [b.owned(r) for r in range(nd)] == [
            (b.start + r * b.chunk, b.start + (r + 1) * b.chunk) for r in range(nd)
        ]
    assert offset == lay.padded_numel == nd * lay.shard_numel
    assert lay.padded_numel - lay.numel <= len(lay.buckets) * (nd - 1)
    # every slot inside its bucket, no overlaps
    for s in lay.slots:
        b = lay.buckets[s.bucket]
        assert b.start <= s.offset and s.offset + s.numel <= b.start + b.numel


def test_bucket_limit_and_oversized_params():
    lay = FlatLayout(SHAPES, 2, 16)
    sizes = [sum(lay.slots[i].numel for i in b.slots) for b in lay.buckets]
    assert all(s <= 16 or len(b.slots) == 1 for s, b in zip(sizes, lay.buckets))


def test_explicit_groups_and_bad_groups():
    lay = FlatLayout(SHAPES, 2, groups=[[0, 1], [2], [3, 4]])
    assert [b.slots for b in lay.buckets] == [(0, 1), (2,), (3, 4)]
    with pytest.raises(ValueError, match="every parameter"):
        FlatLayout(SHAPES, 2, groups=[[0, 1], [2]])
    with pytest.raises(ValueError, match="nd="):
        FlatLayout(SHAPES, 0, 16)


def test_coalesce_joins_only_pieces_that_follow_one_another_in_one_storage():
    flat, other = torch.arange(10.0), torch.arange(4.0)
    joined = coalesce(list(flat.split([3, 3, 4])) + [flat[:2], flat[4:6], other[:2], other[2:]])
    # the split (one run), then a piece that restarts, a gap, another storage (one run)
    assert [(t.untyped_storage() is flat.untyped_storage(), t.storage_offset(), t.numel()) for t in joined] == [
        (True, 0, 10),
        (True, 0, 2),
        (True, 4, 2),
        (False, 0, 4),
    ]
    assert torch.equal(joined[0], flat) and torch.equal(joined[3], other)
    strided = flat[::2]  # not contiguous: left alone
    assert coalesce([strided, flat[5:]])[0] is strided


def test_buffer_pool_reuses_by_length_until_cleared_and_never_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from zerobench.engine.zero.buffers import BufferPool

    pool = BufferPool(torch.float32, torch.device("cpu"))
    a = pool.take(8)
    pool.give(a)
    assert pool.take(4) is not a and pool.take(8) is a  # by length; handed out once
    pool.give(a)
    pool.clear()
    assert pool.take(8) is not a
    with FakeTensorMode():
        fake = BufferPool(torch.float32, torch.device("cpu"))
        b = fake.take(8)
        fake.give(b)
        assert not fake.active and fake.take(8) is not b
