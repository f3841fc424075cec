"""The single-process reference every parallel run is checked against (paper §5: ZeRO-DP trains
as data parallelism does, so as one process does on the whole global batch): plain PyTorch,
torch.optim.Adam and clip_grad_norm_, fp32; and the parallel run's parameters gathered into the
same names, with the distance between the two."""

from __future__ import annotations

import torch

from zerobench.engine.model import GPT
from zerobench.engine.parallel.tensor_parallel import gather_full
from zerobench.engine.step import shifted
from zerobench.runtime.batches import sequences, token_source
from zerobench.trial import TrialSpec


def reference_run(spec: TrialSpec) -> dict:
    """The same training in one process, plain PyTorch, fp32, whole global batch per step."""
    t = spec.train
    device = torch.device(spec.precision.device)
    with device:
        model = GPT(spec.model)
    model.init_weights(t.seed)
    opt = torch.optim.Adam(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)
    data = token_source(spec.data, spec.model.vocab, spec.model.seq, t.seed)
    losses = []
    for step in range(t.steps):
        tokens = sequences(data, step, 0, (spec.global_batch,)).to(device)  # every rank's, in rank order
        opt.zero_grad()
        loss = model(*shifted(tokens))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
        opt.step()
        losses.append(loss.item())
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "losses": losses}


def whole_parameters(engine, ctx) -> dict:
    """The engine's parameters as the single-process model holds them: with MP, every rank's
    slices gathered over its MP group."""
    if ctx.mp.size == 1:
        return engine.full_parameters()
    return gather_full(engine.full_parameters(), engine.model, ctx.mp)


def rel_err(a: dict, b: dict) -> float:
    """‖a − b‖ / ‖b‖ over all parameters together."""
    va = torch.cat([a[k].reshape(-1).float().cpu() for k in sorted(b)])
    vb = torch.cat([b[k].reshape(-1).float().cpu() for k in sorted(b)])
    return float((va - vb).norm() / vb.norm())
