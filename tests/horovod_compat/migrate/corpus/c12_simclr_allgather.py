"""SimCLR-style contrastive pretraining with negatives gathered from all ranks (hvd.allgather inside
the NT-Xent loss, differentiable). Imitates self-supervised learning research repos.
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


class Encoder(nn.Module):
    def __init__(self, in_dim=20, feat_dim=32, proj_dim=16):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(in_dim, feat_dim), nn.LayerNorm(feat_dim), nn.ReLU(),
            nn.Linear(feat_dim, feat_dim), nn.ReLU(),
        )
        # projection head (thrown away after pretraining)
        self.projector = nn.Sequential(nn.Linear(feat_dim, feat_dim), nn.ReLU(),
                                       nn.Linear(feat_dim, proj_dim))

    def forward(self, x):
        return self.projector(self.backbone(x))


def augment(x, g, noise=0.3, drop=0.2):
    """Two cheap 'views': gaussian jitter + random feature dropout + random scaling."""
    mask = (torch.rand(x.shape, generator=g) > drop).float()
    scale = 0.8 + 0.4 * torch.rand(x.size(0), 1, generator=g)
    return (x + noise * torch.randn(x.shape, generator=g)) * mask * scale


def nt_xent_global(z1, z2, temperature=0.5):
    """NT-Xent where each local anchor sees 2*B*world - 1 candidates.

    z1, z2: [B, D] local projections of the two views.
    """
    B = z1.size(0)
    z1 = F.normalize(z1, dim=1)
    z2 = F.normalize(z2, dim=1)
    # negatives from every worker
    z1_all = hvd.allgather(z1, name="z1")
    z2_all = hvd.allgather(z2, name="z2")
    N = z1_all.size(0)
    all_z = torch.cat([z1_all, z2_all], dim=0)           # [2N, D]

    offset = hvd.rank() * B
    idx = torch.arange(B) + offset
    logits1 = z1 @ all_z.t() / temperature               # [B, 2N]
    logits2 = z2 @ all_z.t() / temperature
    # mask self-similarity
    logits1[torch.arange(B), idx] = float("-inf")
    logits2[torch.arange(B), idx + N] = float("-inf")
    # positives: z1_i <-> z2_i
    loss = F.cross_entropy(logits1, idx + N) + F.cross_entropy(logits2, idx)
    return loss / 2


def main():
    parser = argparse.ArgumentParser(description="SimCLR toy")
    parser.add_argument("--batch-size", type=int, default=16, help="per-rank batch (must be equal)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--wd", type=float, default=1e-6)
    parser.add_argument("--n-prototypes", type=int, default=6)
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()

    # unlabeled data: samples around a few prototypes
    protos = torch.randn(args.n_prototypes, 20, generator=torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(4321 + hvd.rank())

    torch.manual_seed(1)
    net = Encoder()
    # LARS is what the paper used; plain SGD here
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr * hvd.size(), momentum=0.9,
                                weight_decay=args.wd)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for it in range(1, args.steps + 1):
        which = torch.randint(0, args.n_prototypes, (args.batch_size,), generator=g)
        x = protos[which] + 0.5 * torch.randn(args.batch_size, 20, generator=g)
        v1, v2 = augment(x, g), augment(x, g)

        net.train()
        loss = nt_xent_global(net(v1), net(v2), temperature=args.temperature)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), it, loss.item()), flush=True)

    # linear-probe style embedding dump
    with torch.no_grad():
        feats = net.backbone(protos)
    if hvd.rank() == 0:
        torch.save(feats, os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()),
                                       "c12_proto_feats.pt"))

    final = 0.0
    for p in net.parameters():
        final += p.data.double().sum().item()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), final), flush=True)


if __name__ == "__main__":
    main()
