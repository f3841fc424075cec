"""Token sequences that do not depend on the parallel layout: sequence i of step t is drawn alone,
from a generator seeded by (seed, t, i), so it is the same whatever the layout is, and a rank draws
only the sequences it trains on (runtime/train.py `rank_batch` says which)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch


def generator(seed: int, step: int, index: int) -> torch.Generator:
    """Sequence `index` of step `step`'s own generator: the three mixed into a 64-bit seed
    (blake2b), so no two sequences share one."""
    digest = hashlib.blake2b(f"{seed}/{step}/{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


class SyntheticTokens:
    """Uniform random tokens."""

    def __init__(self, vocab: int, seq: int, seed: int):
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def fill(self, row: torch.Tensor, step: int, index: int) -> None:
        """Write sequence `index` of step `step` (seq + 1 token ids) into `row`."""
        torch.randint(0, self.vocab, row.shape, generator=generator(self.seed, step, index), out=row)


class CorpusTokens:
    """Byte-level tokens (vocabulary 256) of a text file: sequence i of step t is the window of
    seq + 1 bytes at an offset drawn from its own generator."""

    def __init__(self, path: str | os.PathLike, vocab: int, seq: int, seed: int):
        if vocab < 256:
            raise ValueError(f"vocab={vocab}: byte-level corpus tokens need vocab >= 256")
        self.tokens = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
        if len(self.tokens) <= seq + 1:
            raise ValueError(f"data={path}: {len(self.tokens)} bytes, fewer than seq + 2 ({seq + 2})")
        self.seq, self.seed = seq, seed

    def fill(self, row: torch.Tensor, step: int, index: int) -> None:
        """Write sequence `index` of step `step` (seq + 1 token ids) into `row`."""
        gen = generator(self.seed, step, index)
        start = int(torch.randint(0, len(self.tokens) - self.seq - 1, (1,), generator=gen))
        row.copy_(self.tokens[start : start + self.seq + 1])


TokenSource = SyntheticTokens | CorpusTokens


def corpus_path(data: str) -> Path:
    """A text file by path, or by name among the corpora shipped in zerobench/data/."""
    path = Path(data)
    if path.exists():
        return path
    shipped = Path(__file__).parents[1] / "data" / data  # zerobench/runtime/batches.py -> zerobench/data/
    if not shipped.exists():
        raise FileNotFoundError(f"data={data!r}: neither a file nor a corpus shipped in {shipped.parent}")
    return shipped


def token_source(data: str, vocab: int, seq: int, seed: int) -> TokenSource:
    """`synthetic` (uniform random tokens) or a text corpus (see corpus_path)."""
    if data == "synthetic":
        return SyntheticTokens(vocab, seq, seed)
    return CorpusTokens(corpus_path(data), vocab, seq, seed)


def sequences(source: TokenSource, step: int, first: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Sequences `first`, `first` + 1, ... of step `step`, laid out in `shape` × (seq + 1) token
    ids (int64), in order."""
    out = torch.empty(*shape, source.seq + 1, dtype=torch.long)
    for i, row in enumerate(out.view(-1, source.seq + 1)):
        source.fill(row, step, first + i)
    return out
