"""Switch-Transformer-flavoured toy: a router picks ONE expert per batch, so the other
experts see no gradient that step (dynamic graph under Horovod, SGD + momentum)."""
import sys
import torch
from torch import nn
from torch.nn import functional as F
from horovod import torch as hvd

N_EXPERTS = 4
D_IN, D_HID, N_CLS = 10, 24, 3
STEPS = 20
BATCH = 24
LR = 0.05
MOMENTUM = 0.9


class Expert(nn.Module):
    def __init__(self, d_in, d_hid):
        super(Expert, self).__init__()
        self.fc1 = nn.Linear(d_in, d_hid)
        self.fc2 = nn.Linear(d_hid, d_in)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Top1MoE(nn.Module):
    def __init__(self):
        super(Top1MoE, self).__init__()
        self.router = nn.Linear(D_IN, N_EXPERTS, bias=False)
        self.experts = nn.ModuleList([Expert(D_IN, D_HID) for _ in range(N_EXPERTS)])
        self.classifier = nn.Linear(D_IN, N_CLS)
        self.last_choice = None

    def forward(self, x):
        gate_logits = self.router(x)                      # [B, E]
        probs = gate_logits.softmax(-1).mean(0)           # batch-level routing
        choice = int(probs.argmax())
        self.last_choice = choice
        h = x + probs[choice] * self.experts[choice](x)   # only this expert runs
        return self.classifier(h), probs


def load_balance_loss(probs):
    # cheap auxiliary loss, keeps router from collapsing immediately
    return N_EXPERTS * (probs * probs).sum()


def get_batch(g, shift):
    x = torch.randn(BATCH, D_IN, generator=g) + shift
    y = (x[:, 0] + x[:, 1] * x[:, 2] > shift.sum() / D_IN).long() + (x[:, 3] > 1.0).long()
    return x, y


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(2024)

    model = Top1MoE()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    g = torch.Generator()
    g.manual_seed(31337 + 17 * rank)
    # each rank sees a differently shifted input distribution -> different routing
    shift = torch.linspace(-1.0, 1.0, D_IN) * (1.0 if rank % 2 == 0 else -1.0)

    choices = []
    for step in range(STEPS):
        x, y = get_batch(g, shift)
        optimizer.zero_grad()
        logits, probs = model(x)
        loss = F.cross_entropy(logits, y) + 0.01 * load_balance_loss(probs)
        loss.backward()
        optimizer.step()
        choices.append(model.last_choice)
        print("CORPUS rank=%d step=%d loss=%.6f" % (rank, step, loss.item()), flush=True)

    sys.stdout.write("rank %d expert usage: %s\n" % (rank, [choices.count(e) for e in range(N_EXPERTS)]))
    sys.stdout.flush()
    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        total += p.detach().to(torch.float64).sum()
    print("CORPUS rank=%d final=%.6f" % (rank, total.item()), flush=True)


if __name__ == "__main__":
    main()
