"""The data paths of horovod_compat, for benchmarks that print them side by side in one run.

On one host ranks share memory (the default).  Ranks on several hosts negotiate and move allreduce
data over the set's authenticated TCP mesh (`horovod_compat/common/_mesh.py`), which
`HOROVOD_COMPAT_SHM_DATA=0 HOROVOD_COMPAT_SHM_CONTROL=0` forces on one host.  Sets larger than the
mesh allows (64 ranks) use gloo for both, which `HOROVOD_COMPAT_TCP_CONTROL=0
HOROVOD_COMPAT_TCP_DATA=0` forces as well.
Each entry: (short key, heading, environment for the ranks).
"""
SHM_ON = {"HOROVOD_COMPAT_SHM_DATA": "1", "HOROVOD_COMPAT_SHM_CONTROL": "1"}
SHM_OFF = {"HOROVOD_COMPAT_SHM_DATA": "0", "HOROVOD_COMPAT_SHM_CONTROL": "0"}
GLOO_ONLY = {**SHM_OFF, "HOROVOD_COMPAT_TCP_CONTROL": "0", "HOROVOD_COMPAT_TCP_DATA": "0"}

TRANSPORTS = (
    ("shm", "shared memory (ranks on one host: the default)", SHM_ON),
    ("tcp", "TCP mesh (HOROVOD_COMPAT_SHM_DATA=0 HOROVOD_COMPAT_SHM_CONTROL=0: the path across hosts)",
     SHM_OFF),
    ("gloo", "gloo (... HOROVOD_COMPAT_TCP_CONTROL=0 HOROVOD_COMPAT_TCP_DATA=0: sets over 64 ranks)",
     GLOO_ONLY),
)
