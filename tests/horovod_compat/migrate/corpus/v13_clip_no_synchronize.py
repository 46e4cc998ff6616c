"""Style: a trainer class that clips right after backward() without optimizer.synchronize() (the
line most Horovod ports copied from their single-GPU script), and logs gradient norms from a
helper method after the step, passing the model around."""
import argparse
import logging

import torch
import torch.nn as nn
import horovod.torch as hvd

logging.basicConfig(level=logging.WARNING)


class Encoder(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, tokens):
        return self.head(torch.tanh(self.proj(self.embed(tokens))))


class Trainer:
    def __init__(self, args):
        self.args = args
        self.logger = logging.getLogger("trainer")

    def train(self):
        hvd.init()
        torch.manual_seed(self.args.seed)
        model = Encoder(self.args.vocab, 16)
        optimizer = torch.optim.SGD(model.parameters(), lr=self.args.lr * hvd.size(), momentum=0.9)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

        gen = torch.Generator().manual_seed(1000 + hvd.rank())
        criterion = nn.CrossEntropyLoss()
        for step in range(1, self.args.steps + 1):
            tokens = torch.randint(0, self.args.vocab, (12, 5), generator=gen)
            labels = tokens[:, 0] % 3
            optimizer.zero_grad()
            loss = criterion(model(tokens), labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.clip)
            optimizer.step()
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
            if step % 4 == 0:
                self.log_gradients(model, step)
        total = sum(p.detach().sum() for p in model.parameters()).item()
        print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)

    def log_gradients(self, model, step):
        norms = {name: p.grad.norm().item() for name, p in model.named_parameters() if p.grad is not None}
        self.logger.info("step %d gradient norms %s", step, norms)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=50)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=3)
    Trainer(parser.parse_args()).train()
