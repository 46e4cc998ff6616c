#!/usr/bin/env python
# coding: utf-8
"""Exported with `jupyter nbconvert --to script` from a prototyping notebook:
cell markers, module-level code, no main(), display-style prints.
"""

# # Horovod classifier prototype
# 
# Quick check that distributed training works before moving to the cluster.

# In[1]:


import os, tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

torch.set_num_threads(1)


# In[2]:


hvd.init()
print("rank", hvd.rank(), "of", hvd.size())


# In[3]:


# hyperparams
lr = 0.1
batch_size = 32
epochs = 3
n_features = 8
n_classes = 3
torch.manual_seed(99)


# ## Data
# 
# Synthetic blobs, one shard per worker.

# In[4]:


g = torch.Generator().manual_seed(500 + hvd.rank())
means = torch.tensor([[2.0] * n_features, [-2.0] * n_features, [0.0] * n_features])
y_all = torch.randint(0, n_classes, (batch_size * 4,), generator=g)
X_all = means[y_all] + torch.randn(len(y_all), n_features, generator=g)
X_all.shape, y_all.shape


# In[5]:


print(X_all[:3])
print(torch.bincount(y_all, minlength=n_classes))


# ## Model

# In[6]:


model = nn.Sequential(
    nn.Linear(n_features, 40),
    nn.ReLU(),
    nn.Dropout(0.0),
    nn.Linear(40, 40),
    nn.ReLU(),
    nn.Linear(40, n_classes),
)
model


# In[7]:


optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


# In[8]:


history = []
step = 0
for epoch in range(epochs):
    for i in range(0, len(X_all), batch_size):
        xb, yb = X_all[i:i+batch_size], y_all[i:i+batch_size]
        optimizer.zero_grad()
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        loss.backward()
        optimizer.step()
        step += 1
        history.append(loss.item())
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
    acc = (model(X_all).argmax(1) == y_all).float().mean()
    acc = hvd.allreduce(acc, name="acc")
    if hvd.rank() == 0:
        print(f"epoch {epoch}: acc={acc.item():.3f}")


# In[9]:


# plt.plot(history)  # no matplotlib on the cluster image
print(["%.3f" % h for h in history[-4:]])


# In[10]:


if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b05_nb_model.pt"))


# In[11]:


print(f"CORPUS rank={hvd.rank()} final={sum(p.double().sum() for p in model.parameters()).item():.6f}", flush=True)


# In[ ]:




