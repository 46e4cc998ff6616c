"""``horovod.tensorflow.functions``: variables and Python objects across ranks.

``broadcast_variables`` moves every variable of one dtype in one fused buffer (a model with hundreds
of variables costs one broadcast per dtype, in one round trip); objects travel as cloudpickle bytes
through the runtime (``horovod_compat.common.objects``), the same as ``horovod.torch``'s."""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod_compat.common import collectives as _rt
from horovod_compat.common import objects as _objects
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .mpi_ops import _executing_eagerly, _np_dtype, _run, _to_buffer, _wait

__all__ = ["broadcast_variables", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
           "broadcast_object", "broadcast_object_fn", "allgather_object"]


def _broadcast_group(tensors: Sequence[tf.Tensor], root_rank: int,
                     process_set: ProcessSet) -> List[tf.Tensor]:
    """Rank ``root_rank``'s values of ``tensors``, one fused broadcast per dtype, one node."""
    dtypes = [t.dtype for t in tensors]

    def fn(op_name: Optional[str], *arrays: np.ndarray) -> List[np.ndarray]:
        arrays = [np.asarray(a) for a in arrays]
        outs: List[Any] = [None] * len(arrays)
        by_dtype: dict = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype.str, []).append(i)
        for j, idx in enumerate(by_dtype.values()):
            flat = np.concatenate([arrays[i].reshape(-1) for i in idx])
            buf = _to_buffer(flat).clone()
            got = _wait(_rt.submit_broadcast(buf, root_rank, op_name and f"{op_name}.{j}",
                                             process_set, True), process_set).numpy()
            offset = 0
            for i in idx:
                n = arrays[i].size
                outs[i] = got[offset: offset + n].reshape(arrays[i].shape).astype(
                    _np_dtype(dtypes[i]), copy=False)
                offset += n
        return outs

    outs = _run(fn, tensors, dtypes, "HorovodBroadcastGroup")
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return outs


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set, inplace: bool = False) -> Any:
    """Assign rank ``root_rank``'s values to ``variables`` on every rank of the set.

    Eagerly the variables are assigned at once (returns None); in a graph this returns the op
    that assigns them."""
    variables = list(variables)
    if not variables:
        return None if _executing_eagerly() else tf.no_op()
    values = _broadcast_group([tf.convert_to_tensor(v) for v in variables], int(root_rank),
                              process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    return None if _executing_eagerly() else tf.group(*assigns)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 graphs: broadcast every global variable from ``root_rank`` (an op to run)."""
    if _executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` "
                           "instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 ``tf.compat.v1.train.MonitoredTrainingSession`` (and ``tf.estimator``-era) hook: once the
    session is created -- variables initialized or restored from a checkpoint -- every global
    variable gets rank ``root_rank``'s value (``broadcast_global_variables``).

    Horovod 0.28.1 defines it on ``tf.estimator.SessionRunHook``, which TensorFlow 2.16 removed;
    ``tf.compat.v1.train.SessionRunHook`` is the same class."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op: Any = None
        self.device = device

    def begin(self) -> None:
        # (a hook reused for a new graph, e.g. Estimator's train then train again, builds anew)
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (cloudpickle; other ranks may pass anything)."""
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function ``obj -> rank root_rank's obj`` (Horovod's form for elastic states)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank's ``obj``, in rank order."""
    return _objects.allgather_object(obj, name=name, process_set=process_set)
