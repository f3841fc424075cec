"""The token batches (zerobench/runtime/batches.py): a rank's micro-batches are `micro_batch`
sequences each, read from the trial's own micro-batch, never recovered by dividing the global batch."""

import pytest
import torch

from zerobench.runtime.batches import CorpusTokens, micro_batches, token_source


def test_each_rank_takes_micro_batch_sequences_per_micro_step_in_micro_rank_order():
    mb, ga, dp = 3, 2, 2
    tokens = torch.arange(mb * ga * dp).unsqueeze(1).repeat(1, 5)  # sequence i is all i
    for rank in range(dp):
        got = [x[:, 0].tolist() for x, _ in micro_batches(tokens, micro_batch=mb, dp=dp, dp_rank=rank)]
        # [micro][rank][b]: micro-step m of rank r holds sequences (m * dp + r) * mb ...
        assert got == [[(m * dp + rank) * mb + b for b in range(mb)] for m in range(ga)]


def test_a_global_batch_of_no_whole_micro_steps_is_refused_naming_the_micro_batch():
    with pytest.raises(ValueError, match="micro_batch=3"):
        list(micro_batches(torch.zeros(8, 5, dtype=torch.long), micro_batch=3, dp=2, dp_rank=0))


def test_a_shipped_corpus_is_found_by_name():
    tokens = token_source("corpus_tinyshakespeare.txt", 256, 16, 0)
    assert isinstance(tokens, CorpusTokens) and tokens.global_batch(0, 2).shape == (2, 17)
