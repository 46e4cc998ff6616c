"""``horovod.ray`` on Ray 2.x: ``RayExecutor`` places the ranks as Ray actors and runs functions in
them (``ElasticRayExecutor`` and ``RayExecutor(min_workers=...)``: elastically); inside,
``hvd.init()`` is this project's runtime (docs/ray.md). Needs the ``ray`` extra."""
from distributor.extras import require as _require

_require("ray", "horovod.ray")

from .elastic import ElasticRayExecutor  # noqa: E402
from .runner import MiniSettings, RayExecutor  # noqa: E402
from .worker import BaseHorovodWorker  # noqa: E402

__all__ = ["RayExecutor", "ElasticRayExecutor", "BaseHorovodWorker", "MiniSettings"]
