"""The two data paths of horovod_compat, for benchmarks that print both in one run.

On one host ranks share memory (the default); ranks on several hosts move data and coordination
through gloo, which `HOROVOD_COMPAT_SHM_DATA=0 HOROVOD_COMPAT_SHM_CONTROL=0` forces on one host.
Each entry: (short key, heading, environment for the ranks).
"""
SHM_ON = {"HOROVOD_COMPAT_SHM_DATA": "1", "HOROVOD_COMPAT_SHM_CONTROL": "1"}
SHM_OFF = {"HOROVOD_COMPAT_SHM_DATA": "0", "HOROVOD_COMPAT_SHM_CONTROL": "0"}

TRANSPORTS = (
    ("shm", "shared memory (ranks on one host: the default)", SHM_ON),
    ("gloo", "gloo (HOROVOD_COMPAT_SHM_DATA=0 HOROVOD_COMPAT_SHM_CONTROL=0: the path across hosts)", SHM_OFF),
)
