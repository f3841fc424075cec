"""Megatron's vocab-parallel cross-entropy (parallel/tensor_parallel.py) on a group of one, against
torch's: the loss and its gradient, the padded rows masked, and a second backward refused (the
saved softmax becomes the gradient in place)."""

import pytest
import torch
import torch.nn.functional as F

from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.tensor_parallel import TensorParallel, VocabShard, vocab_parallel_cross_entropy
from zerobench.engine.parallel.topology import Group

TP = TensorParallel(Group("mp", 1, 0), Comms())  # a group of one: its all-reduces are no-ops


def _logits(rows: int, cols: int) -> torch.Tensor:
    return torch.randn(
        rows, cols, generator=torch.Generator().manual_seed(0), dtype=torch.float32
    )  # the loss computes in fp32


def test_loss_and_gradient_match_torch():
    x, targets = _logits(37, 11), torch.arange(37) % 11
    mine = x.clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(mine, targets, VocabShard(11, 0, 11), TP)
    ref = x.clone().requires_grad_()
    ref_loss = F.cross_entropy(ref, targets)
    # by hand as well: the mean over rows of logsumexp(row) - row[target]
    by_hand = (torch.logsumexp(x.double(), dim=1) - x.double()[torch.arange(37), targets]).mean()
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=0, abs=1e-6)
    assert loss.item() == pytest.approx(by_hand.item(), rel=0, abs=1e-6)
    loss.backward()
    ref_loss.backward()
    assert torch.allclose(mine.grad, ref.grad, rtol=0, atol=1e-7)


def test_padded_rows_are_masked():
    # 11 real tokens padded to 13 columns: the two padded logits never count, whatever their value
    x, targets = _logits(9, 13), torch.arange(9) % 11
    x[:, 11:] = 100.0
    loss = vocab_parallel_cross_entropy(x, targets, VocabShard(11, 0, 13), TP)
    assert loss.item() == pytest.approx(F.cross_entropy(x[:, :11], targets).item(), abs=1e-6)


def test_a_second_backward_is_refused():
    x = _logits(5, 7).requires_grad_()
    loss = vocab_parallel_cross_entropy(x, torch.arange(5), VocabShard(7, 0, 7), TP)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
