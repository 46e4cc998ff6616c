"""GRU seq2one forecaster on synthetic multi-seasonal series, gradient-norm clipping done the Horovod
way (synchronize -> clip -> step under skip_synchronize). Imitates time-series forecasting repos.
"""
import argparse
import logging
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

import horovod.torch as hvd

logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(message)s")
logger = logging.getLogger(__name__)


def generate_series(length: int, seed: int) -> np.ndarray:
    rs = np.random.RandomState(seed)
    t = np.arange(length, dtype=np.float32)
    daily = np.sin(2 * math.pi * t / 24.0)
    weekly = 0.5 * np.sin(2 * math.pi * t / (24.0 * 7))
    trend = 0.002 * t
    noise = 0.1 * rs.randn(length).astype(np.float32)
    return (daily + weekly + trend + noise).astype(np.float32)


class WindowDataset(torch.utils.data.Dataset):
    def __init__(self, series: np.ndarray, lookback: int, horizon: int):
        self.x = torch.from_numpy(series)
        self.lookback, self.horizon = lookback, horizon
        mu, sd = self.x.mean(), self.x.std()
        self.x = (self.x - mu) / sd

    def __len__(self):
        return len(self.x) - self.lookback - self.horizon + 1

    def __getitem__(self, i):
        past = self.x[i:i + self.lookback].unsqueeze(-1)
        fut = self.x[i + self.lookback:i + self.lookback + self.horizon]
        return past, fut


class GRUForecaster(nn.Module):
    def __init__(self, hidden: int = 24, horizon: int = 6):
        super().__init__()
        self.gru = nn.GRU(input_size=1, hidden_size=hidden, num_layers=1, batch_first=True)
        self.proj = nn.Linear(hidden, horizon)

    def forward(self, x):
        out, h_n = self.gru(x)
        return self.proj(h_n[-1])


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lookback", type=int, default=24)
    p.add_argument("--horizon", type=int, default=6)
    p.add_argument("--series-len", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--clip", type=float, default=0.2)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    if hvd.rank() != 0:
        logger.setLevel(logging.WARNING)

    # every rank gets a different sensor / store
    series = generate_series(args.series_len, seed=1000 + hvd.rank())
    ds = WindowDataset(series, args.lookback, args.horizon)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(hvd.rank()),
                                         drop_last=True)

    torch.manual_seed(123)
    model = GRUForecaster(horizon=args.horizon)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    criterion = nn.SmoothL1Loss()

    step = 0
    done = False
    while not done:
        for past, fut in loader:
            model.train()
            optimizer.zero_grad()
            pred = model(past)
            loss = criterion(pred, fut)
            loss.backward()

            # make sure the allreduce has finished before clipping
            optimizer.synchronize()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with optimizer.skip_synchronize():
                optimizer.step()

            step += 1
            print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, loss.item()), flush=True)
            if step % 4 == 0:
                logger.info("step %d loss %.4f grad_norm(pre-clip) %.3f", step, loss.item(),
                            float(grad_norm))
            if step >= args.max_steps:
                done = True
                break

    if hvd.rank() == 0:
        ckpt = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c11_gru.pt")
        torch.save({"state_dict": model.state_dict(), "args": vars(args)}, ckpt)
        logger.info("wrote %s", ckpt)

    final = sum(float(p.detach().double().sum()) for p in model.parameters())
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), final), flush=True)


if __name__ == "__main__":
    main()
