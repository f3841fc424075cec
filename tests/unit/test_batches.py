"""The token sequences (zerobench/runtime/batches.py): a rank draws only its own slice, grad_accum
micro-batches of micro_batch sequences, read from the trial's own sizes; every layout's slices
together are the same sequences, in rank order."""

import pytest
import torch

from zerobench.engine.config import TrainConfig
from zerobench.runtime.batches import CorpusTokens, SyntheticTokens, sequences, token_source
from zerobench.runtime.train import rank_batch


def test_each_rank_holds_its_own_micro_batches_and_together_the_same_sequences_whatever_the_layout():
    data = SyntheticTokens(vocab=50, seq=7, seed=3)
    whole = sequences(data, 4, 0, (12,))
    assert whole.shape == (12, 8) and whole.dtype == torch.long and int(whole.max()) < 50
    for dp, mb, ga in [(1, 12, 1), (2, 3, 2), (3, 2, 2), (4, 1, 3)]:
        train = TrainConfig(micro_batch=mb, grad_accum=ga)
        slices = [rank_batch(data, 4, train, r) for r in range(dp)]
        assert all(s.shape == (ga, mb, 8) for s in slices)  # this rank's own, nothing more
        assert torch.equal(torch.cat([s.reshape(-1, 8) for s in slices]), whole)


def test_a_sequence_depends_on_its_seed_step_and_index_only():
    data = SyntheticTokens(vocab=1000, seq=15, seed=0)
    first = sequences(data, 0, 0, (3,))
    assert torch.equal(sequences(data, 0, 2, (1,))[0], first[2])  # drawn alone: no sequence before it is drawn
    assert not torch.equal(first[0], first[1])
    assert not torch.equal(sequences(data, 1, 0, (1,))[0], first[0])
    assert not torch.equal(sequences(SyntheticTokens(1000, 15, 1), 0, 0, (1,))[0], first[0])


def test_a_shipped_corpus_is_found_by_name_and_gives_windows_of_its_bytes():
    tokens = token_source("corpus_tinyshakespeare.txt", 256, 16, 0)
    assert isinstance(tokens, CorpusTokens)
    batch = rank_batch(tokens, 0, TrainConfig(micro_batch=2), 1)
    assert batch.shape == (1, 2, 17)
    text = bytes(tokens.tokens.to(torch.uint8).tolist())
    assert bytes(batch[0, 1].to(torch.uint8).tolist()) in text


def test_a_corpus_needs_byte_tokens():
    with pytest.raises(ValueError, match="vocab=100"):
        token_source("corpus_tinyshakespeare.txt", 100, 16, 0)
