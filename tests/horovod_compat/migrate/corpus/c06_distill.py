"""Knowledge distillation (Hinton-style KD loss) from a frozen wide teacher into a narrow student.

Imitates model-compression research code: teacher is broadcast but never optimized.
"""
import argparse
import logging
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

logger = logging.getLogger("kd")


def mlp(d_in, width, d_out):
    return nn.Sequential(
        nn.Linear(d_in, width), nn.ReLU(inplace=True),
        nn.Linear(width, width), nn.ReLU(inplace=True),
        nn.Linear(width, d_out),
    )


class KDLoss(nn.Module):
    def __init__(self, T=4.0, alpha=0.7):
        super().__init__()
        self.T = T
        self.alpha = alpha

    def forward(self, s_logits, t_logits, target):
        soft = F.kl_div(F.log_softmax(s_logits / self.T, dim=-1),
                        F.softmax(t_logits / self.T, dim=-1),
                        reduction="batchmean") * (self.T ** 2)
        hard = F.cross_entropy(s_logits, target)
        return self.alpha * soft + (1. - self.alpha) * hard


def freeze(m: nn.Module):
    for p in m.parameters():
        p.requires_grad = False
    m.eval()
    return m


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--teacher-width", type=int, default=64)
    ap.add_argument("--student-width", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--temperature", type=float, default=4.0)
    ap.add_argument("--alpha", type=float, default=0.7)
    return ap.parse_args()


def main():
    args = parse()
    torch.set_num_threads(1)
    hvd.init()
    logging.basicConfig(level=logging.INFO, format=f"[%(name)s r{hvd.rank()}] %(message)s")

    # NB: different seed per rank on purpose -- the broadcasts below must fix it up
    torch.manual_seed(100 + hvd.rank())
    teacher = mlp(args.dim, args.teacher_width, args.classes)
    student = mlp(args.dim, args.student_width, args.classes)

    hvd.broadcast_parameters(teacher.state_dict(), root_rank=0)
    teacher = freeze(teacher)
    hvd.broadcast_parameters(student.state_dict(), root_rank=0)

    n_t = sum(p.numel() for p in teacher.parameters())
    n_s = sum(p.numel() for p in student.parameters())
    if hvd.rank() == 0:
        logger.info("teacher %d params (frozen), student %d params", n_t, n_s)

    optimizer = torch.optim.Adam(student.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=student.named_parameters(prefix="student"))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    criterion = KDLoss(T=args.temperature, alpha=args.alpha)
    gen = torch.Generator().manual_seed(2024 * (hvd.rank() + 1))

    for step in range(1, args.steps + 1):
        x = torch.randn(args.bs, args.dim, generator=gen)
        with torch.no_grad():
            t_logits = teacher(x)
            # labels are noisy teacher argmax
            y = t_logits.argmax(-1)
            flip = torch.rand(args.bs, generator=gen) < 0.1
            y[flip] = torch.randint(0, args.classes, (int(flip.sum()),), generator=gen)
        student.train()
        s_logits = student(x)
        loss = criterion(s_logits, t_logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        if step % 4 == 0:
            agree = (s_logits.argmax(-1) == t_logits.argmax(-1)).float().mean()
            agree = hvd.allreduce(agree, name="agree").item()
            if hvd.rank() == 0:
                logger.info("step %d  teacher/student agreement %.3f", step, agree)

    # sanity: the teacher must not have moved
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())

    if hvd.rank() == 0:
        out = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c06_student.pth")
        torch.save(student.state_dict(), out)

    final = torch.stack([p.detach().double().sum() for p in student.parameters()]).sum()
    print(f"CORPUS rank={hvd.rank()} final={final.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
