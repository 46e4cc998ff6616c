"""``horovod.common.elastic``: the framework-independent part of Horovod's elastic API (``State``,
``ObjectState``, ``run_fn``), the same objects as ``horovod_compat.torch.elastic``'s."""
from horovod_compat.torch.elastic.runner import run_fn  # noqa: F401
from horovod_compat.torch.elastic.state import ObjectState, State  # noqa: F401

__all__ = ["State", "ObjectState", "run_fn"]
