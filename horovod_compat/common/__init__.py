"""``horovod.common``: the runtime every framework binding shares (Horovod's own split: ``common`` is
the runtime, ``horovod.torch`` and ``horovod.tensorflow`` are bindings of it). See docs/architecture.md."""
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
