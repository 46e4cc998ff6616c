"""``horovod.common``: framework-independent pieces of the Horovod API (its exceptions)."""
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
