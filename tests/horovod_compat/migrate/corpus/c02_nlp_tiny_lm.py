"""Tiny causal transformer LM on a synthetic token stream.

Style: NLP research repo with a config dataclass and a dict of optimizers stepped by name.
"""
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, asdict

import torch
from torch import nn

import horovod.torch as hvd


@dataclass
class LMConfig:
    vocab_size: int = 23
    d_model: int = 16
    n_head: int = 2
    d_ff: int = 32
    seq_len: int = 12
    batch_size: int = 6
    steps: int = 10
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 17
    dropout: float = 0.0  # keep 0 so reruns match exactly


class TinyLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(1, cfg.seq_len, cfg.d_model))
        layer = nn.TransformerEncoderLayer(d_model=cfg.d_model, nhead=cfg.n_head,
                                           dim_feedforward=cfg.d_ff, dropout=cfg.dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tok(idx) * math.sqrt(self.cfg.d_model) + self.pos[:, :T]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.encoder(x, mask=mask)
        return self.head(self.ln_f(x))


def make_corpus(cfg: LMConfig, rank: int, n_tokens: int = 2000) -> torch.Tensor:
    # a noisy "grammar": next token = (3*prev + 1) mod V most of the time
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    toks = torch.empty(n_tokens, dtype=torch.long)
    toks[0] = 0
    noise = torch.rand(n_tokens, generator=g)
    rnd = torch.randint(0, cfg.vocab_size, (n_tokens,), generator=g)
    for i in range(1, n_tokens):
        toks[i] = rnd[i] if noise[i] < 0.15 else (3 * toks[i - 1] + 1) % cfg.vocab_size
    return toks


def get_batch(data, cfg, g):
    ix = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=g)
    x = torch.stack([data[i:i + cfg.seq_len] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + cfg.seq_len] for i in ix])
    return x, y


def main():
    torch.set_num_threads(1)
    hvd.init()
    cfg = LMConfig()
    if hvd.rank() == 0:
        print("config:", asdict(cfg), file=sys.stderr)

    torch.manual_seed(cfg.seed)
    model = TinyLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    if hvd.rank() == 0:
        print(f"model has {n_params} params", file=sys.stderr)

    # decay / no-decay split like every GPT codebase
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.dim() < 2 or "ln" in n or "norm" in n else decay).append(p)
    base = torch.optim.AdamW([
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ], lr=cfg.lr, betas=(0.9, 0.98))

    optimizers = {"main": hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())}
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for opt in optimizers.values():
        hvd.broadcast_optimizer_state(opt, root_rank=0)

    data = make_corpus(cfg, hvd.rank())
    g = torch.Generator().manual_seed(cfg.seed + 7 * hvd.rank())
    crit = nn.CrossEntropyLoss()

    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        model.train()
        x, y = get_batch(data, cfg, g)
        for name in optimizers:
            optimizers[name].zero_grad()
        logits = model(x)
        loss = crit(logits.view(-1, cfg.vocab_size), y.view(-1))
        loss.backward()
        for name, opt in optimizers.items():
            opt.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        if hvd.rank() == 0 and step % 5 == 0:
            ppl = math.exp(loss.item())
            print(f"step {step} ppl {ppl:.2f} ({time.time() - t0:.1f}s)", file=sys.stderr)

    if hvd.rank() == 0:
        path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c02_tiny_lm.pt")
        torch.save({"model": model.state_dict(),
                    "optimizers": {k: v.state_dict() for k, v in optimizers.items()},
                    "cfg": asdict(cfg)}, path)

    final = 0.0
    for p in model.parameters():
        final += p.double().sum().item()
    print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)


if __name__ == "__main__":
    main()
