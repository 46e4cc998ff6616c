"""Horovod-facing parts of horovod-compat: the hvd shim, HorovodRunner, timeline, migration."""
