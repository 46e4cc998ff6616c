"""Style: long-running job with rank-0 checkpointing every N steps and auto-resume (resume epoch shared with hvd.broadcast_object, weights with broadcast_parameters).

The job is "restarted" once inside the process to exercise the resume path; the
checkpoint directory lives under $CORPUS_TMP and is removed on success.
"""
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

CKPT_DIR = os.path.join(os.environ.get("CORPUS_TMP", "/tmp"), "v09_checkpoints")
CKPT_PATH = os.path.join(CKPT_DIR, "last.pt")
STEPS_PER_EPOCH = 2
SAVE_EVERY = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, kernel_size=3, padding=1)
        self.fc = nn.Linear(4 * 8, 3)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).flatten(1))


def run(max_epochs):
    torch.manual_seed(55)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03 * hvd.size(), momentum=0.9)

    resume_epoch = 0
    if hvd.rank() == 0 and os.path.exists(CKPT_PATH):
        ckpt = torch.load(CKPT_PATH)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["opt"])
        resume_epoch = ckpt["epoch"]
    resume_epoch = hvd.broadcast_object(resume_epoch, root_rank=0, name="resume_epoch")

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    global_step = resume_epoch * STEPS_PER_EPOCH
    for epoch in range(resume_epoch, max_epochs):
        gen = torch.Generator().manual_seed(1000 * epoch + hvd.rank())
        for _ in range(STEPS_PER_EPOCH):
            x = torch.randn(6, 2, 8, generator=gen)
            y = torch.randint(0, 3, (6,), generator=gen)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"CORPUS rank={hvd.rank()} step={global_step} loss={loss.item():.6f}", flush=True)
            global_step += 1
            if global_step % SAVE_EVERY == 0 and hvd.rank() == 0:
                os.makedirs(CKPT_DIR, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": optimizer.state_dict(),
                            "epoch": epoch + 1}, CKPT_PATH)
    hvd.barrier()
    return model


def main():
    hvd.init()
    torch.set_num_threads(1)
    run(max_epochs=2)          # first launch, "preempted" after 2 epochs
    model = run(max_epochs=4)  # relaunch: resumes from the last checkpoint
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)
    if hvd.rank() == 0:
        shutil.rmtree(CKPT_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
