"""``horovod.runner.common.util``: ``secret`` and ``timeout`` (see the package above)."""
