"""Dense-retrieval (DPR-style) bi-encoder toy: separate query and document towers kept as
two modules, trained with in-batch-negative InfoNCE under a single Horovod optimizer."""
import itertools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd


@dataclass(frozen=True)
class RetrievalArgs:
    vocab_size: int = 64
    dim: int = 16
    q_len: int = 5
    d_len: int = 12
    batch_size: int = 12
    temperature: float = 0.1
    lr: float = 5e-3
    num_steps: int = 16
    seed: int = 8


class BagEncoder(nn.Module):
    def __init__(self, vocab_size, dim, depth=1):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim, mode="mean")
        blocks = []
        for _ in range(depth):
            blocks += [nn.Linear(dim, dim), nn.Tanh()]
        self.mlp = nn.Sequential(*blocks)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, ids):
        return F.normalize(self.proj(self.mlp(self.embed(ids))), dim=-1)


class PairSampler:
    """Documents are random token bags; a query is a noisy subset of its document."""

    def __init__(self, a: RetrievalArgs, rank: int):
        self.a = a
        self.g = torch.Generator().manual_seed(a.seed * 1009 + rank)

    def __iter__(self):
        return self

    def __next__(self):
        a = self.a
        docs = torch.randint(0, a.vocab_size, (a.batch_size, a.d_len), generator=self.g)
        pick = torch.randint(0, a.d_len, (a.batch_size, a.q_len), generator=self.g)
        queries = torch.gather(docs, 1, pick)
        noise = torch.rand(queries.shape, generator=self.g) < 0.2
        rand_tok = torch.randint(0, a.vocab_size, queries.shape, generator=self.g)
        return torch.where(noise, rand_tok, queries), docs


class BiEncoderTrainer:
    def __init__(self, args: RetrievalArgs):
        self.args = args
        torch.manual_seed(args.seed)
        self.query_encoder = BagEncoder(args.vocab_size, args.dim, depth=1)
        self.doc_encoder = BagEncoder(args.vocab_size, args.dim, depth=2)
        hvd.broadcast_parameters(self.query_encoder.state_dict(), root_rank=0)
        hvd.broadcast_parameters(self.doc_encoder.state_dict(), root_rank=0)

        params = list(self.query_encoder.parameters()) + list(self.doc_encoder.parameters())
        base = torch.optim.Adam(params, lr=args.lr)
        named = itertools.chain(
            (("query_encoder." + n, p) for n, p in self.query_encoder.named_parameters()),
            (("doc_encoder." + n, p) for n, p in self.doc_encoder.named_parameters()),
        )
        self.optimizer = hvd.DistributedOptimizer(base, named_parameters=named)
        self.labels = torch.arange(args.batch_size)

    def loss(self, q_ids, d_ids):
        q = self.query_encoder(q_ids)
        d = self.doc_encoder(d_ids)
        scores = q @ d.t() / self.args.temperature
        return F.cross_entropy(scores, self.labels)

    def fit(self):
        data = PairSampler(self.args, hvd.rank())
        for step, (q_ids, d_ids) in zip(range(self.args.num_steps), data):
            self.optimizer.zero_grad()
            loss = self.loss(q_ids, d_ids)
            loss.backward()
            self.optimizer.step()
            print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, loss.item()), flush=True)

    @torch.no_grad()
    def param_checksum(self):
        towers = (self.query_encoder, self.doc_encoder)
        return sum(p.double().sum() for t in towers for p in t.parameters()).item()


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    trainer = BiEncoderTrainer(RetrievalArgs())
    trainer.fit()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), trainer.param_checksum()), flush=True)
