"""``horovod.common.exceptions``: the same exception classes as ``horovod_compat.torch.exceptions``."""
from horovod_compat.torch.exceptions import (  # noqa: F401
    HorovodInternalError,
    HostsUpdatedInterrupt,
    get_version_mismatch_message,
)

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "get_version_mismatch_message"]
