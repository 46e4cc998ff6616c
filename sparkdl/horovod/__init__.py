"""Import alias for `from sparkdl.horovod import log_to_driver` (see `horovod_compat.runner`)."""
from horovod_compat.runner import HorovodRunner, log_to_driver

__all__ = ["HorovodRunner", "log_to_driver"]
