"""Style: tiny two-tower / matrix-factorisation recommender with dense nn.Embedding tables; per-rank predictions gathered with hvd.allgather and an AUC computed on rank 0.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

NUM_USERS = 40
NUM_ITEMS = 30
EMB_DIM = 8


class MFRecommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_emb = nn.Embedding(NUM_USERS, EMB_DIM)
        self.item_emb = nn.Embedding(NUM_ITEMS, EMB_DIM)
        self.user_bias = nn.Embedding(NUM_USERS, 1)
        self.item_bias = nn.Embedding(NUM_ITEMS, 1)
        self.mlp = nn.Sequential(nn.Linear(2 * EMB_DIM, 16), nn.ReLU(), nn.Linear(16, 1))
        nn.init.normal_(self.user_emb.weight, std=0.1)
        nn.init.normal_(self.item_emb.weight, std=0.1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users, items):
        u, i = self.user_emb(users), self.item_emb(items)
        dot = (u * i).sum(-1, keepdim=True)
        deep = self.mlp(torch.cat([u, i], dim=-1))
        return (dot + deep + self.user_bias(users) + self.item_bias(items)).squeeze(-1)


def auc_score(scores, labels):
    pos = scores[labels > 0.5]
    neg = scores[labels <= 0.5]
    if pos.numel() == 0 or neg.numel() == 0:
        return 0.5
    diff = pos.unsqueeze(1) - neg.unsqueeze(0)
    return ((diff > 0).double().sum() + 0.5 * (diff == 0).double().sum()).item() / diff.numel()


def sample_interactions(gen, n):
    users = torch.randint(0, NUM_USERS, (n,), generator=gen)
    items = torch.randint(0, NUM_ITEMS, (n,), generator=gen)
    clicks = ((users * 7 + items * 3) % 5 < 2).float()
    return users, items, clicks


def main():
    hvd.init()
    torch.manual_seed(17)
    torch.set_num_threads(1)

    model = MFRecommender()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(321 + hvd.rank())
    for step in range(1, 7):
        users, items, clicks = sample_interactions(gen, 32)
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(users, items), clicks)
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    model.eval()
    with torch.no_grad():
        users, items, clicks = sample_interactions(gen, 24)
        preds = torch.sigmoid(model(users, items))
    all_preds = hvd.allgather(preds, name="eval_preds")
    all_labels = hvd.allgather(clicks, name="eval_labels")
    if hvd.rank() == 0:
        auc = auc_score(all_preds, all_labels)
        assert 0.0 <= auc <= 1.0 and all_preds.shape[0] == 24 * hvd.size()

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
