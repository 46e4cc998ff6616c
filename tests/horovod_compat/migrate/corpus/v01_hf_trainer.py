"""Style: HuggingFace-Trainer-like class (self.args, self.model, create_optimizer(), train()) with Horovod-documented gradient clipping.

Gradients are clipped after optimizer.synchronize() and the step runs inside
optimizer.skip_synchronize(), as the Horovod docs recommend.
"""
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


@dataclass
class TrainingArguments:
    learning_rate: float = 0.05
    weight_decay: float = 0.01
    max_grad_norm: float = 0.5
    max_steps: int = 6
    per_device_train_batch_size: int = 8
    seed: int = 42
    output_dir: str = os.environ.get("CORPUS_TMP", "/tmp")


class TinyClassifier(nn.Module):
    def __init__(self, hidden=16, num_labels=3):
        super().__init__()
        self.dense = nn.Linear(10, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, labels=None):
        logits = self.classifier(torch.tanh(self.dense(input_ids)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Trainer:
    def __init__(self, model, args: TrainingArguments):
        self.args = args
        self.model = model
        self.optimizer = None
        self.global_step = 0

    def get_train_batch(self, generator):
        bs = self.args.per_device_train_batch_size
        x = torch.randn(bs, 10, generator=generator)
        y = torch.randint(0, 3, (bs,), generator=generator)
        return {"input_ids": x, "labels": y}

    def create_optimizer(self):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                (no_decay if n.endswith("bias") else decay).append(p)
            grouped = [
                {"params": decay, "weight_decay": self.args.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ]
            opt = torch.optim.SGD(grouped, lr=self.args.learning_rate * hvd.size(), momentum=0.9)
            self.optimizer = hvd.DistributedOptimizer(
                opt, named_parameters=self.model.named_parameters())
        return self.optimizer

    def training_step(self, batch):
        self.model.train()
        outputs = self.model(**batch)
        loss = outputs["loss"]
        loss.backward()
        return loss.detach()

    def train(self):
        optimizer = self.create_optimizer()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        gen = torch.Generator().manual_seed(self.args.seed + hvd.rank())
        for step in range(self.args.max_steps):
            batch = self.get_train_batch(gen)
            optimizer.zero_grad()
            loss = self.training_step(batch)
            # Horovod: make sure all async allreduces are done before clipping.
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            with optimizer.skip_synchronize():
                optimizer.step()
            self.global_step += 1
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        return self.global_step


def main():
    hvd.init()
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    args = TrainingArguments()
    trainer = Trainer(TinyClassifier(), args)
    trainer.train()
    total = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
