"""Message-passing GNN on a small fixed random graph, nodes partitioned across ranks; node embeddings
of the owned partition are hvd.allgather'ed for a global (graph-level) readout.
Imitates hand-written GNN research code (no PyG), scatter via index_add_.
"""
import argparse
import os
import tempfile
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

NUM_NODES = 32
NUM_EDGES = 96
FEAT_DIM = 6
HIDDEN = 24


def random_graph(seed: int = 11) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=g)
    dst = torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=g)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # make it undirected
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    x = torch.randn(NUM_NODES, FEAT_DIM, generator=g)
    return edge_index, x


class MPLayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin_self = nn.Linear(d_in, d_out)
        self.lin_msg = nn.Linear(d_in, d_out, bias=False)

    def forward(self, h, edge_index, deg):
        src, dst = edge_index
        msg = self.lin_msg(h)[src]
        agg = torch.zeros(h.size(0), msg.size(1), dtype=h.dtype)
        agg = agg.index_add_(0, dst, msg)
        agg = agg / deg.clamp(min=1).unsqueeze(-1)
        return F.relu(self.lin_self(h) + agg)


class GNN(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        dims = [FEAT_DIM] + [HIDDEN] * layers
        self.convs = nn.ModuleList([MPLayer(a, b) for a, b in zip(dims[:-1], dims[1:])])
        self.node_head = nn.Linear(HIDDEN, 1)
        self.graph_head = nn.Sequential(nn.Linear(2 * HIDDEN, 16), nn.ReLU(), nn.Linear(16, 1))

    def embed(self, x, edge_index, deg):
        h = x
        for conv in self.convs:
            h = conv(h, edge_index, deg)
        return h


def targets(x, edge_index, deg):
    # node target: mean of neighbours' first feature; graph target: global variance of feature 1
    src, dst = edge_index
    nb = torch.zeros(NUM_NODES).index_add_(0, dst, x[src, 0]) / deg.clamp(min=1)
    return nb.unsqueeze(-1), x[:, 1].var().reshape(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--graph-weight", type=float, default=0.5)
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    assert NUM_NODES % hvd.size() == 0, "partitions must be equal for allgather readout"
    part = NUM_NODES // hvd.size()
    lo, hi = hvd.rank() * part, (hvd.rank() + 1) * part

    edge_index, x_base = random_graph()
    deg = torch.zeros(NUM_NODES).index_add_(0, edge_index[1], torch.ones(edge_index.size(1)))

    torch.manual_seed(0)
    model = GNN()
    print(f"[rank {hvd.rank()}] owns nodes {lo}..{hi - 1}; "
          f"{sum(p.numel() for p in model.parameters())} params")
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    gen = torch.Generator().manual_seed(97 + hvd.rank())
    for epoch in range(args.epochs):
        model.train()
        # rank-specific feature noise = data augmentation
        x = x_base + args.noise * torch.randn(x_base.shape, generator=gen)
        y_node, y_graph = targets(x, edge_index, deg)

        optimizer.zero_grad()
        h = model.embed(x, edge_index, deg)
        h_local = h[lo:hi]
        node_loss = F.mse_loss(model.node_head(h_local), y_node[lo:hi])

        h_all = hvd.allgather(h_local, name="node_emb")     # [NUM_NODES, HIDDEN]
        readout = torch.cat([h_all.mean(0), h_all.max(0).values])
        y_graph_avg = hvd.allreduce(y_graph, name="graph_target")
        graph_loss = F.mse_loss(model.graph_head(readout), y_graph_avg)

        loss = node_loss + args.graph_weight * graph_loss
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={epoch + 1} loss={loss.item():.6f}", flush=True)

    if hvd.rank() == 0:
        out = os.environ.get("CORPUS_TMP", tempfile.gettempdir())
        torch.save({"model": model.state_dict(), "edge_index": edge_index},
                   os.path.join(out, "c10_gnn.pt"))

    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float64)
        for p in model.parameters():
            total += p.double().sum()
    print(f"CORPUS rank={hvd.rank()} final={total.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
