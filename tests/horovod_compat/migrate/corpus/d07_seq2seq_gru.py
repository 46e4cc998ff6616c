"""Seq2seq (GRU encoder/decoder) sequence-reversal toy in the style of the classic
PyTorch translation tutorial, adapted to Horovod with the documented clip-grad recipe."""
import random

import torch
import torch.nn as nn
import horovod.torch as hvd

SOS, EOS = 0, 1


class HParams:
    vocab = 12
    emb = 8
    hidden = 16
    seq_len = 6
    batch = 16
    iters = 18
    lr = 0.01
    clip = 0.5
    teacher_forcing_ratio = 0.5
    seed = 77


class EncoderRNN(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, batch_first=True)

    def forward(self, src):
        _, h = self.gru(self.embedding(src))
        return h


class DecoderRNN(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tok, h):
        o, h = self.gru(self.embedding(tok).unsqueeze(1), h)
        return self.out(o.squeeze(1)), h


class Seq2Seq(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.encoder = EncoderRNN(hp.vocab, hp.emb, hp.hidden)
        self.decoder = DecoderRNN(hp.vocab, hp.emb, hp.hidden)

    def forward(self, src, tgt, teacher_forcing):
        h = self.encoder(src)
        tok = torch.full((src.size(0),), SOS, dtype=torch.long)
        logits = []
        for t in range(tgt.size(1)):
            step_logits, h = self.decoder(tok, h)
            logits.append(step_logits)
            tok = tgt[:, t] if teacher_forcing else step_logits.argmax(-1).detach()
        return torch.stack(logits, 1)


def random_batch(hp, gen):
    src = torch.randint(2, hp.vocab, (hp.batch, hp.seq_len), generator=gen)
    tgt = torch.flip(src, dims=[1])
    tgt = torch.cat([tgt, torch.full((hp.batch, 1), EOS, dtype=torch.long)], 1)
    return src, tgt


def train_step(model, optimizer, criterion, src, tgt, use_tf, hp):
    optimizer.zero_grad()
    logits = model(src, tgt, use_tf)
    loss = criterion(logits.reshape(-1, hp.vocab), tgt.reshape(-1))
    loss.backward()
    # Make sure gradients are averaged before clipping them.
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
    with optimizer.skip_synchronize():
        optimizer.step()
    return loss.item()


def main():
    hp = HParams()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(hp.seed)

    model = Seq2Seq(hp)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    rng = random.Random(hp.seed * 31 + hvd.rank())
    gen = torch.Generator().manual_seed(hp.seed + 1 + hvd.rank())
    n_tf = 0
    for it in range(hp.iters):
        src, tgt = random_batch(hp, gen)
        use_tf = rng.random() < hp.teacher_forcing_ratio
        n_tf += int(use_tf)
        loss = train_step(model, optimizer, criterion, src, tgt, use_tf, hp)
        print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), it, loss), flush=True)

    print("rank %d used teacher forcing on %d/%d iters" % (hvd.rank(), n_tf, hp.iters), flush=True)
    with torch.no_grad():
        s = torch.zeros(1, dtype=torch.float64)
        for p in model.parameters():
            s += p.double().sum()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), s.item()), flush=True)


if __name__ == "__main__":
    main()
