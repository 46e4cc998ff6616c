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
it Adasum-combines weight deltas (``_adasum``)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.common.ops import Adasum, Average
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .compression import Compression
from .mpi_ops import ADASUM_SPARSE, allreduce, grouped_allreduce

__all__ = ["allreduce_gradients", "scales"]


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
