"""Token batches that do not depend on the parallel layout: the global batch of step t is the
same whatever dp and grad_accum are, and each (micro-batch, DP rank) takes a fixed slice of it,
so any layout can be compared with a single-process run over the whole global batch."""

from __future__ import annotations

import os
from pathlib import Path

import torch


class SyntheticTokens:
    """Uniform random tokens from a generator seeded by (seed, step)."""

    def __init__(self, vocab: int, seq: int, seed: int):
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def global_batch(self, step: int, n: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.vocab, (n, self.seq + 1), generator=gen)


class CorpusTokens:
    """Byte-level tokens (vocabulary 256) of a text file: the global batch of step t is n windows
    of seq + 1 bytes at offsets drawn from a generator seeded by (seed, step)."""

    def __init__(self, path: str | os.PathLike, vocab: int, seq: int, seed: int):
        if vocab < 256:
            raise ValueError(f"vocab={vocab}: byte-level corpus tokens need vocab >= 256")
        self.tokens = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
        if len(self.tokens) <= seq + 1:
            raise ValueError(f"data={path}: {len(self.tokens)} bytes, fewer than seq + 2 ({seq + 2})")
        self.seq, self.seed = seq, seed

    def global_batch(self, step: int, n: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (n,), generator=gen)
        return torch.stack([self.tokens[s : s + self.seq + 1] for s in starts.tolist()])


def corpus_path(data: str) -> Path:
    """A text file by path, or by name among the corpora shipped in zerobench/data/."""
    path = Path(data)
    if path.exists():
        return path
    shipped = Path(__file__).parents[1] / "data" / data  # zerobench/runtime/batches.py -> zerobench/data/
    if not shipped.exists():
        raise FileNotFoundError(f"data={data!r}: neither a file nor a corpus shipped in {shipped.parent}")
    return shipped


def token_source(data: str, vocab: int, seq: int, seed: int):
    """`synthetic` (uniform random tokens) or a text corpus (see corpus_path)."""
    if data == "synthetic":
        return SyntheticTokens(vocab, seq, seed)
    return CorpusTokens(corpus_path(data), vocab, seq, seed)


def micro_batches(tokens: torch.Tensor, *, micro_batch: int, dp: int, dp_rank: int):
    """Yield (inputs, targets) of this DP rank's micro-batches, `micro_batch` sequences each, one per
    micro-step of the global batch `tokens`; sample order is [micro][rank][b]."""
    per_step = micro_batch * dp  # sequences one micro-step takes over all DP ranks
    if tokens.shape[0] % per_step:
        raise ValueError(f"micro_batch={micro_batch}: {tokens.shape[0]} sequences are not micro-steps of {per_step}")
    for lo in range(dp_rank * micro_batch, tokens.shape[0], per_step):
        chunk = tokens[lo : lo + micro_batch]
        yield chunk[:, :-1], chunk[:, 1:]
