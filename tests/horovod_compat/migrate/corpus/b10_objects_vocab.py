"""Text-classification prep as done in NLP repos: rank 0 builds the vocab and
broadcasts it as a Python object, per-rank stats dicts are allgathered for a
report, and barriers fence the file writes.
"""
import json
import os
import tempfile
from collections import Counter
from typing import Dict, List

import torch
import torch.nn as nn
import horovod.torch as hvd

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima "
         "mike november oscar papa quebec romeo sierra tango").split()
OUT_DIR = os.environ.get("CORPUS_TMP", tempfile.gettempdir())


def fake_corpus(seed: int, n_docs: int = 96, doc_len: int = 12) -> List[List[str]]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(WORDS), (n_docs, doc_len), generator=g)
    return [[WORDS[j] for j in row.tolist()] for row in idx]


def label_of(doc: List[str]) -> int:
    # docs with more early-alphabet words are "positive"
    return int(sum(1 for w in doc if w < "kilo") > len(doc) // 2)


def build_vocab(docs, min_freq=1) -> Dict[str, int]:
    counts = Counter(w for d in docs for w in d)
    vocab = {"<pad>": 0, "<unk>": 1}
    for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if c >= min_freq:
            vocab[w] = len(vocab)
    return vocab


def encode(docs, vocab):
    return torch.tensor([[vocab.get(w, 1) for w in d] for d in docs], dtype=torch.long)


class BagOfWords(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 24):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab_size, dim, mode="mean")
        self.fc = nn.Linear(dim, 2)

    def forward(self, tokens):
        return self.fc(self.emb(tokens))


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(2718)

    # vocab comes from rank 0's view of the data (e.g. a header file only it reads)
    vocab = None
    if rank == 0:
        vocab = build_vocab(fake_corpus(seed=0, n_docs=200))
        with open(os.path.join(OUT_DIR, "b10_vocab.json"), "w") as f:
            json.dump(vocab, f)
    vocab = hvd.broadcast_object(vocab, root_rank=0, name="vocab")
    hvd.barrier()  # make sure the vocab file is on disk before anyone lists OUT_DIR

    docs = fake_corpus(seed=100 + rank)
    X = encode(docs, vocab)
    Y = torch.tensor([label_of(d) for d in docs])

    model = BagOfWords(len(vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    criterion = nn.CrossEntropyLoss()

    stats = {"rank": rank, "n_docs": len(docs), "pos": int(Y.sum()), "losses": []}
    step = 0
    for epoch in range(3):
        for b in range(0, len(X), 16):
            optimizer.zero_grad()
            loss = criterion(model(X[b:b + 16]), Y[b:b + 16])
            loss.backward()
            optimizer.step()
            step += 1
            stats["losses"].append(round(loss.item(), 6))
            print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)

    stats["mean_loss"] = sum(stats["losses"]) / len(stats["losses"])
    del stats["losses"]
    all_stats = hvd.allgather_object(stats)
    if rank == 0:
        for s in sorted(all_stats, key=lambda d: d["rank"]):
            print("worker {rank}: {n_docs} docs, {pos} positive, mean loss {mean_loss:.4f}".format(**s))
        with open(os.path.join(OUT_DIR, "b10_stats.json"), "w") as f:
            json.dump(all_stats, f, indent=1)
    hvd.barrier()

    final = sum(p.double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={rank} final={final:.6f}", flush=True)


if __name__ == "__main__":
    main()
