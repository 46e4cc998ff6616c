"""Averaging gradients across ranks: the one routine behind ``DistributedGradientTape``,
``DistributedOptimizer`` (TF1 and Keras) and ``PartialDistributedGradientTape``.

Dense gradients go in ONE grouped allreduce (one round trip, fused on the wire), whatever their
number and dtypes; ``tf.IndexedSlices`` are allgathered (values and indices), or densified first
with ``sparse_as_dense``; ``None`` gradients stay ``None``; a rank outside ``process_set`` keeps
its local gradients.  ``gradient_predivide_factor`` splits
the averaging into a division before the sum and the rest after it, as Horovod does.

``op=Adasum`` combines the gradients with the Adasum rule instead (per tensor, the runtime's
Adasum), as Horovod's tape does; sparse gradients then need ``sparse_as_dense`` (Horovod's
``NotImplementedError`` otherwise).  A TF1 ``DistributedOptimizer(op=Adasum)`` does not come here:
it Adasum-combines weight deltas (``_adasum``).

Local variables (Horovod's model-parallel API: an optimizer's ``register_local_var``, a tape's
``register_local_source``, ``PartialDistributedGradientTape``'s ``local_layers``, the broadcast
callback's ``local_variables``) are held by a ``LocalVariables``; ``reduce_gradients`` leaves their
gradients out of the reduction and, with ``scale_local_gradients``, divides them by the set's size,
so that a later global average keeps their scale."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod_compat.common.ops import Adasum, Average
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .compression import Compression
from .mpi_ops import ADASUM_SPARSE, allreduce, grouped_allreduce

__all__ = ["allreduce_gradients", "reduce_gradients", "scales", "LocalVariables", "set_size"]


def scales(op: int, gradient_predivide_factor: float) -> tuple:
    """``(op, prescale, postscale)`` for Horovod's ``gradient_predivide_factor``."""
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        return Average, 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return op, 1.0, 1.0


def allreduce_gradients(grads: Sequence[Any], op: int = Average,
                        compression: Any = Compression.none, sparse_as_dense: bool = False,
                        gradient_predivide_factor: float = 1.0,
                        process_set: ProcessSet = global_process_set,
                        name: Optional[str] = None) -> List[Any]:
    """``grads`` reduced over the set (see the module docstring)."""
    op, prescale, postscale = scales(op, gradient_predivide_factor)
    grads = list(grads)
    if not process_set.included():  # a rank outside the set keeps its own gradients (Horovod's)
        return grads
    if op == Adasum and not sparse_as_dense and \
            any(isinstance(g, tf.IndexedSlices) for g in grads):
        raise NotImplementedError(ADASUM_SPARSE)  # before any gradient is reduced
    out: List[Any] = list(grads)
    dense_idx: List[int] = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                out[i] = tf.convert_to_tensor(g)
                dense_idx.append(i)
            else:
                out[i] = allreduce(g, op=op, process_set=process_set)
        else:
            dense_idx.append(i)
    if dense_idx:
        reduced = grouped_allreduce([out[i] for i in dense_idx], op=op, compression=compression,
                                    prescale_factor=prescale, postscale_factor=postscale,
                                    process_set=process_set, name=name)
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


class LocalVariables:
    """The variables (or tensors) registered as local, matched by identity: a Keras 3 variable
    and the ``tf.Variable`` it wraps are the same (either may be registered or passed).  A plain
    object, not a list or dict, so that Keras and TensorFlow do not track it as an optimizer's
    attribute; it keeps what it holds alive, so that the identities stay unique."""

    def __init__(self) -> None:
        self._held: Dict[int, Any] = {}

    @staticmethod
    def _ids(var: Any) -> List[int]:
        inner = getattr(var, "_value", None)
        return [id(var), id(inner)] if isinstance(inner, tf.Variable) else [id(var)]

    def register(self, var: Any) -> None:
        for i in self._ids(var):
            self._held[i] = var

    def __contains__(self, var: Any) -> bool:
        return any(i in self._held for i in self._ids(var))

    def __bool__(self) -> bool:
        return bool(self._held)


def set_size(process_set: ProcessSet) -> Any:
    """The set's size as a Python number, or (traced, in an elastic job, whose size can change
    between calls of an already traced step) as a tensor read when the step runs."""
    if tf.executing_eagerly() or os.environ.get("HOROVOD_ELASTIC", "0") in ("", "0"):
        return process_set.size()
    return tf.numpy_function(lambda: np.float32(process_set.size()), [], tf.float32,
                             stateful=True)


def _divide(grad: Any, n: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any], local: LocalVariables,
                     scale_local_gradients: bool = True, op: int = Average,
                     compression: Any = Compression.none, sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """``grads`` (of ``variables``) reduced over the set in one grouped allreduce, except those of
    the ``local`` variables: these stay this rank's, divided by the set's size with
    ``scale_local_gradients`` (see the module docstring)."""
    is_local = [v in local for v in variables] if local else [False] * len(grads)
    global_idx = [i for i, loc in enumerate(is_local) if not loc]
    out = list(grads)
    reduced = allreduce_gradients([grads[i] for i in global_idx], op=op, compression=compression,
                                  sparse_as_dense=sparse_as_dense,
                                  gradient_predivide_factor=gradient_predivide_factor,
                                  process_set=process_set)
    for i, g in zip(global_idx, reduced):
        out[i] = g
    if scale_local_gradients and any(is_local):
        n = set_size(process_set)
        if not isinstance(n, int) or n > 1:
            for i, loc in enumerate(is_local):
                if loc and out[i] is not None:
                    out[i] = _divide(out[i], n)
    return out
