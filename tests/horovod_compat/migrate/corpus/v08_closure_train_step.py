"""Style: functional/JAX-inspired loop: train_step = make_train_step(model, optimizer, loss_fn) returns a closure that captures the model and the wrapped optimizer.
"""
import functools

import torch
import torch.nn as nn

import horovod.torch as hvd


def make_train_step(model, optimizer, loss_fn):
    def train_step(batch):
        inputs, targets = batch
        model.train()
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return train_step


def make_eval_step(model, loss_fn):
    @torch.no_grad()
    def eval_step(batch):
        inputs, targets = batch
        model.eval()
        return loss_fn(model(inputs), targets)

    return eval_step


def log_step(fn):
    @functools.wraps(fn)
    def wrapper(step, batch):
        loss = fn(batch)
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        return loss

    return wrapper


def batches(generator, n, bs=8):
    for _ in range(n):
        x = torch.randn(bs, 4, 4, generator=generator)
        y = torch.randint(0, 2, (bs,), generator=generator)
        yield x, y


def main():
    hvd.init()
    torch.manual_seed(8)
    torch.set_num_threads(1)

    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 2))
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    loss_fn = nn.CrossEntropyLoss()
    train_step = log_step(make_train_step(model, opt, loss_fn))
    eval_step = make_eval_step(model, loss_fn)

    gen = torch.Generator().manual_seed(4242 + hvd.rank())
    for step, batch in enumerate(batches(gen, 6)):
        train_step(step, batch)

    val = torch.stack([eval_step(b) for b in batches(gen, 2)]).mean()
    val = hvd.allreduce(val, name="val_loss", op=hvd.Average)
    del val

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
