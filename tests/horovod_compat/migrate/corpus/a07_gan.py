"""DCGAN-style two-network training (generator + discriminator, each with its own Horovod
DistributedOptimizer), on a 2-D toy distribution as in GAN tutorials/research prototypes."""
import argparse
import logging
import math

import torch
import torch.nn as nn
import horovod.torch as hvd

log = logging.getLogger("gan")

parser = argparse.ArgumentParser()
parser.add_argument("--nz", type=int, default=4, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=32)
parser.add_argument("--ndf", type=int, default=32)
parser.add_argument("--niter", type=int, default=8, help="number of iterations")
parser.add_argument("--batchSize", type=int, default=32)
parser.add_argument("--lrG", type=float, default=2e-4)
parser.add_argument("--lrD", type=float, default=2e-4)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--manualSeed", type=int, default=999)


class Generator(nn.Module):
    def __init__(self, nz, ngf):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(nz, ngf), nn.LeakyReLU(0.2),
            nn.Linear(ngf, ngf), nn.LeakyReLU(0.2),
            nn.Linear(ngf, 2),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(2, ndf), nn.LeakyReLU(0.2),
            nn.Linear(ndf, ndf), nn.LeakyReLU(0.2),
            nn.Linear(ndf, 1),
        )

    def forward(self, x):
        return self.main(x).view(-1)


def weights_init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.1)
        nn.init.zeros_(m.bias)


def sample_real(n, gen):
    # 8 gaussians on a circle
    k = torch.randint(0, 8, (n,), generator=gen).float()
    centers = torch.stack([torch.cos(k * math.pi / 4), torch.sin(k * math.pi / 4)], 1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


def set_requires_grad(net, flag):
    for p in net.parameters():
        p.requires_grad = flag


def main():
    opt = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO if hvd.rank() == 0 else logging.ERROR)
    torch.manual_seed(opt.manualSeed)

    netG = Generator(opt.nz, opt.ngf)
    netG.apply(weights_init)
    netD = Discriminator(opt.ndf)
    netD.apply(weights_init)

    criterion = nn.BCEWithLogitsLoss()
    real_label, fake_label = 1.0, 0.0

    optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lrD * hvd.size(), betas=(opt.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lrG * hvd.size(), betas=(opt.beta1, 0.999))
    optimizerD = hvd.DistributedOptimizer(optimizerD, named_parameters=netD.named_parameters())
    optimizerG = hvd.DistributedOptimizer(optimizerG,
                                          named_parameters=netG.named_parameters(prefix="G"))

    # sync both nets and both optimizers from rank 0
    hvd.broadcast_parameters(netG.state_dict(), root_rank=0)
    hvd.broadcast_parameters(netD.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizerG, root_rank=0)
    hvd.broadcast_optimizer_state(optimizerD, root_rank=0)

    data_gen = torch.Generator().manual_seed(opt.manualSeed + hvd.rank())
    noise_gen = torch.Generator().manual_seed(opt.manualSeed * 3 + hvd.rank())
    step = 0
    for it in range(opt.niter):
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        set_requires_grad(netD, True)
        optimizerD.zero_grad()
        real = sample_real(opt.batchSize, data_gen)
        label = torch.full((opt.batchSize,), real_label)
        errD_real = criterion(netD(real), label)
        noise = torch.randn(opt.batchSize, opt.nz, generator=noise_gen)
        fake = netG(noise)
        label = torch.full((opt.batchSize,), fake_label)
        errD_fake = criterion(netD(fake.detach()), label)
        errD = errD_real + errD_fake
        errD.backward()
        optimizerD.step()
        step += 1
        print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, errD.item()), flush=True)

        ############################
        # (2) Update G network: maximize log(D(G(z)))
        ###########################
        set_requires_grad(netD, False)  # D's grads are not needed here
        optimizerG.zero_grad()
        label = torch.full((opt.batchSize,), real_label)  # fake labels are real for generator cost
        errG = criterion(netD(fake), label)
        errG.backward()
        optimizerG.step()
        step += 1
        print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, errG.item()), flush=True)

        if it % 4 == 0:
            log.info("[%d/%d] Loss_D: %.4f Loss_G: %.4f", it, opt.niter, errD.item(), errG.item())

    total = 0.0
    for net in (netG, netD):
        for p in net.parameters():
            total += p.double().sum().item()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), total), flush=True)


if __name__ == "__main__":
    main()
