"""Token batches that do not depend on the parallel layout: the global batch of step t is the
same whatever dp and grad_accum are, and each (micro-batch, DP rank) takes a fixed slice of it,
so any layout can be compared with a single-process run over the whole global batch."""

from __future__ import annotations

import torch


class SyntheticTokens:
    """Uniform random tokens from a generator seeded by (seed, step)."""

    def __init__(self, vocab: int, seq: int, seed: int):
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def global_batch(self, step: int, n: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.vocab, (n, self.seq + 1), generator=gen)


def micro_batches(tokens: torch.Tensor, grad_accum: int, dp: int, dp_rank: int):
    """Yield (inputs, targets) of this DP rank's micro-batches; sample order is [micro][rank][b]."""
    per = tokens.shape[0] // (grad_accum * dp)
    for m in range(grad_accum):
        lo = (m * dp + dp_rank) * per
        chunk = tokens[lo : lo + per]
        yield chunk[:, :-1], chunk[:, 1:]
