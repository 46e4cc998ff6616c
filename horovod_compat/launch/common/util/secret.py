"""``horovod.runner.common.util.secret``: a job's secret key (the one this project's sockets
authenticate with: ``distributor.protocol``)."""
from distributor.protocol import new_secret as make_secret_key

__all__ = ["make_secret_key"]
