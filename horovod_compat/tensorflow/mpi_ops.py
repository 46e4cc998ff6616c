"""``horovod.tensorflow.mpi_ops``: Horovod's collectives on TensorFlow tensors, on the shared runtime.

How a TensorFlow tensor reaches the runtime (``horovod_compat.common``): its NumPy view becomes a
torch buffer without a copy (``torch.from_numpy``), the runtime's collective runs on it exactly as
for ``horovod.torch`` (negotiation by position or name, shared memory on one host, gloo/TCP across
hosts, the timeline, the stall inspector, ``join``), and the result comes back as a NumPy array that
TensorFlow wraps.  Eagerly that is a direct call; inside ``tf.function`` (Keras traces
``train_step``) it is one ``tf.numpy_function`` node per op -- a grouped op (``grouped_allreduce``,
the gradient tape, ``DistributedOptimizer``) is ONE node for all its tensors.

Order inside a graph: TensorFlow may run independent nodes in any order and in parallel, but every
rank must submit collectives in the same order (and a node that blocks for peers must not starve
another that they wait for).  So each collective node of a graph gets a control dependency on the
previous collective node built in the same graph: the graph runs them in the order the program
built them, which is the same on every rank.

Gradients are Horovod's (``tf.custom_gradient``): allreduce -> allreduce of the gradient with the
same op and scales; allgather -> averaged gradient, this rank's rows; broadcast -> averaged
gradient on the root, zeros elsewhere; alltoall -> alltoall back along the received splits;
reducescatter -> allgather of the gradient (times the set's size for Sum).

A TF1 graph's session runs independent collective nodes on its inter-op threads, and each blocks
its thread until the peers submit the same op: if every thread of both ranks held a different op,
the job would wait for ever.  TensorFlow sizes that pool from ``TF_NUM_INTEROP_THREADS`` when a
session's config leaves it unset, so importing this module sets it (only if unset) to
``INTEROP_THREADS``: a graph may then run up to that many collectives at once.

A node runs on one of TensorFlow's inter-op threads, not the thread that called the function.
torch's element-wise work there (the runtime's copies, scaling, shared-memory reductions) would
start an OpenMP team per such thread, whose spinning workers contend with TensorFlow's and the
peer ranks' threads for the cores: a 1 MB allreduce took twice as long as on the caller's thread.
So a node whose tensors are small (``SERIAL_BELOW`` bytes in all) runs torch on one thread for the
duration of the call, restored afterwards; large ones keep torch's threads, where they pay.

Not here: GPU-resident collectives (TensorFlow tensors on a GPU are staged through host memory),
XLA compilation of these ops (``jit_compile=True`` cannot contain a ``numpy_function``).
"""
from __future__ import annotations

import collections
import os
import threading
import warnings
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import torch
from tensorflow.python.eager import record as _record
from tensorflow.python.framework.ops import EagerTensor
from torch.utils.dlpack import to_dlpack

from horovod_compat.common import collectives as _rt
from horovod_compat.common import lifecycle as _life
from horovod_compat.common.exceptions import HorovodInternalError
from horovod_compat.common.lifecycle import *  # noqa: F401,F403
from horovod_compat.common.lifecycle import __all__ as _life_all
from horovod_compat.common.ops import Adasum, Average, Max, Min, Product, Sum
from horovod_compat.common.process_sets import *  # noqa: F401,F403
from horovod_compat.common.process_sets import __all__ as _ps_all
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from . import _native
from .compression import Compression
from .util import _executing_eagerly  # noqa: F401  (Horovod's tests import it from here too)

#: Inter-op threads for TF1 sessions and the eager context, when the user set none (see above).
INTEROP_THREADS = 64
os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(max(INTEROP_THREADS, os.cpu_count() or 1)))

__all__ = list(_life_all) + list(_ps_all) + [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier",
    "size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op",
]

# torch.from_numpy warns for read-only arrays (TensorFlow's are); the runtime only reads inputs.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        module=r"horovod_compat\.tensorflow")

_BF16 = np.dtype(tf.bfloat16.as_numpy_dtype)
# dtypes gloo cannot carry, and how they travel: reductions convert to a wider type that gloo
# reduces (unsigned sums wrap around exactly as in the narrow type once converted back), the other
# collectives move the same bytes under a signed type of the same width.
_REDUCE_AS = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64),
              np.dtype(np.uint64): np.dtype(np.int64), _BF16: np.dtype(np.float32)}
_MOVE_AS = {np.dtype(np.uint16): np.dtype(np.int16), np.dtype(np.uint32): np.dtype(np.int32),
            np.dtype(np.uint64): np.dtype(np.int64), _BF16: np.dtype(np.int16)}


def _to_buffer(a: Any, reduce: bool = False) -> torch.Tensor:
    """A torch view of the NumPy array ``a`` in a dtype the runtime carries (see above)."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        a = np.array(a, order="C")
    if reduce and a.dtype in _REDUCE_AS:
        a = a.astype(_REDUCE_AS[a.dtype])
    elif a.dtype in _MOVE_AS:
        a = a.view(_MOVE_AS[a.dtype])
    return torch.from_numpy(a)


def _from_buffer(t: torch.Tensor, dtype: np.dtype, reduce: bool = False) -> np.ndarray:
    out = t.numpy()
    if out.dtype == dtype:
        return out
    if reduce or dtype not in _MOVE_AS:
        return out.astype(dtype)
    return out.view(dtype)


def _to_tf(a: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """An eager TensorFlow tensor of the NumPy array ``a`` (``_tf_of`` its torch view), or a copy
    where torch cannot view it (e.g. bfloat16)."""
    a = np.asarray(a)  # (a NumPy scalar, e.g. barrier's result, has no buffer of its own)
    try:
        t = torch.from_numpy(a)
    except TypeError:
        return tf.convert_to_tensor(a, dtype=dtype)
    return _tf_of(t, dtype)


def _tf_of(t: torch.Tensor, dtype: tf.DType) -> tf.Tensor:
    """An eager TensorFlow tensor of the torch tensor ``t``: its memory handed over through DLPack
    (no copy), or copied where DLPack cannot carry it."""
    if t.data_ptr() % 64 == 0:  # TF kernels (Eigen) abort on a buffer not 64-byte aligned
        try:
            out = tf.experimental.dlpack.from_dlpack(to_dlpack(t))
        except (TypeError, RuntimeError, ValueError, tf.errors.OpError):
            out = None
        if out is not None and out.dtype == dtype:
            return out
    return tf.convert_to_tensor(t.numpy(), dtype=dtype)


def _wait(pending: Any, process_set: ProcessSet) -> Any:
    """The op's result.  Ranks that disagreed on the op (Horovod's "Mismatched ..." messages, or
    an op not supported during a join) get TensorFlow's ``FailedPreconditionError``, as Horovod
    raises it, and the set stays usable; any other failure (a peer left, a transport broke) stays
    ``HorovodInternalError`` -- decided by the message, not by the set's state, which a transport
    may mark broken only after raising."""
    try:
        return pending.wait()
    except HorovodInternalError as exc:
        text = str(exc)
        if text.startswith("Mismatched") or "while some ranks have called hvd.join()" in text:
            raise tf.errors.FailedPreconditionError(None, None, text) from exc
        raise


# ----------------------------------------------------------------------------- running an op

_order_lock = threading.Lock()
_last_node: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _run(fn: Callable[..., Any], inputs: Sequence[Any], tout: Sequence[tf.DType], label: str,
         name: Optional[str] = None) -> List[tf.Tensor]:
    """``fn(op_name, *numpy_inputs) -> list of numpy outputs`` as TensorFlow tensors.

    Eagerly ``fn`` is called at once.  In a ``tf.function`` it becomes one ``tf.numpy_function``
    node ordered after the function's previous collective node (program order; unnamed ops pair by
    position, as eagerly).  In a TF1 graph, whose session runs only the nodes a fetch needs (so a
    chain would re-run earlier collectives), an unnamed op is named after its node, which is the
    same on every rank that built the same graph, and ops pair by name whatever order they run in.
    """
    if tf.executing_eagerly():
        try:
            outs = fn(name, *[np.asarray(x) for x in inputs])  # views of the tensors, no copies
        except ValueError as exc:  # what a graph's node raises for it (Horovod's error type)
            raise tf.errors.InvalidArgumentError(None, None, str(exc)) from exc
        return [_to_tf(o, d) for o, d in zip(outs, tout)]
    graph = tf.compat.v1.get_default_graph()
    if not graph.building_function:
        op_name = name or graph.unique_name(f"hvd.{label}")
        outs, _ = _node(fn, op_name, inputs, tout, label)
        return outs
    with _order_lock:
        prev = _last_node.get(graph)
        with tf.control_dependencies([prev] if prev is not None else []):
            outs, last = _node(fn, name, inputs, tout, label)
        _last_node[graph] = last
    return outs


#: Below this many input bytes a graph node's torch work runs on one thread (see above).
SERIAL_BELOW = 4 << 20


def _node(fn: Callable[..., Any], name: Optional[str], inputs: Sequence[Any],
          tout: Sequence[tf.DType], label: str) -> Tuple[List[tf.Tensor], Any]:
    """The graph node of one collective: its outputs, and the op that ends it.

    With the compiled check op (``_native``) the node returns a failure's TensorFlow status as
    two more outputs, and the check op fails the step with it (``FailedPreconditionError`` for
    Horovod's mismatches, as Horovod's kernels) or forwards the results; without it, a failure
    raises inside the node, which TensorFlow reports as ``UnknownError``."""
    check = _native.check_op()
    if check is None:
        outs = tf.numpy_function(_in_node(fn, name), list(inputs), list(tout), stateful=True,
                                 name=label)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return outs, outs[0].op if outs else None
    outs = tf.numpy_function(_in_node(fn, name, tout), list(inputs),
                             list(tout) + [tf.int32, tf.string], stateful=True, name=label)
    checked = check(outs[-2], outs[-1], list(outs[:-2]), name=f"{label}Check")
    if isinstance(checked, tf.Operation):  # an op without outputs
        return [], checked
    checked = list(checked)
    return checked, checked[0].op if checked else outs[0].op


#: The last few ``HorovodInternalError`` that graph nodes' collectives raised. TensorFlow gives
#: the caller only their text (in an ``UnknownError``); `node_error` finds the error itself, with
#: the rank that failed first and whether it froze (`exceptions.peer_failure`).
_node_errors: "collections.deque[HorovodInternalError]" = collections.deque(maxlen=8)


def node_error(message: str) -> Optional[HorovodInternalError]:
    """The ``HorovodInternalError`` a graph node raised whose text `message` (an ``UnknownError``'s)
    carries, the most recent first; None if none does."""
    for exc in reversed(list(_node_errors)):
        if str(exc) and str(exc) in message:
            return exc
    return None


def _in_node(fn: Callable[..., Any], name: Optional[str],
             report: Optional[Sequence[tf.DType]] = None) -> Callable[..., Any]:
    """``fn`` as the body of a ``tf.numpy_function`` node (run on a TensorFlow pool thread).

    With ``report`` (the node's output dtypes) the body also returns a status, ``code`` and
    ``message``: TensorFlow's error code of a failure that Horovod reports with its own TensorFlow
    error type (``_wait``), with empty results; 0 and "" with the real results otherwise."""
    def serial(*arrays: np.ndarray) -> Any:
        if sum(a.nbytes for a in arrays) >= SERIAL_BELOW:
            return fn(name, *arrays)
        threads = torch.get_num_threads()
        if threads == 1:
            return fn(name, *arrays)
        torch.set_num_threads(1)
        try:
            return fn(name, *arrays)
        finally:
            torch.set_num_threads(threads)

    def call(*arrays: np.ndarray) -> Any:
        try:
            return serial(*arrays)
        except HorovodInternalError as exc:
            _node_errors.append(exc)
            raise

    if report is None:
        return call

    def reporting(*arrays: np.ndarray) -> List[Any]:
        try:
            outs = call(*arrays)
        except tf.errors.OpError as exc:
            return [np.zeros(0, dtype=_np_dtype(d)) for d in report] + \
                [np.int32(exc.error_code), exc.message.encode("utf-8", "replace")]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return outs + [np.int32(0), b""]
    return reporting


def _check_set(process_set: ProcessSet) -> None:
    """Horovod's ``ValueError``, raised where the op is called (also while a graph is built), for
    a process set the runtime does not know; a rank outside a known set fails when the op runs."""
    if process_set is global_process_set:
        return
    known = _life.get_process_set_ids_and_ranks()
    if process_set.process_set_id not in known or \
            known[process_set.process_set_id] != list(process_set.ranks):
        raise ValueError(f"{process_set} is not registered with Horovod: create it with "
                         f"hvd.add_process_set(...) or hvd.init(process_sets=[...])")


def _np_dtype(d: tf.DType) -> np.dtype:
    return np.dtype(d.as_numpy_dtype)


def _check_supported(t: tf.Tensor) -> None:
    if t.dtype in (tf.string, tf.variant, tf.resource) or t.dtype.is_quantized:
        raise ValueError(f"Horovod collectives do not support tensors of type {t.dtype.name}")


# ----------------------------------------------------------------------------- allreduce

def _reduce_np(tensors: Sequence[tf.Tensor], op: int, prescale: float, postscale: float,
               name: Optional[str], process_set: ProcessSet,
               when: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
    """Allreduce ``tensors`` (one grouped op when more than one) without gradients.

    ``when`` (a boolean scalar tensor, the same on every rank): reduce only when it is true, else
    return the inputs -- decided when the node runs, in the node, so that it keeps its place in
    the function's chain of collectives (``Adasum``'s delta optimizer reduces every N-th step)."""
    _check_set(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        _check_supported(t)
    dtypes = [t.dtype for t in tensors]
    kind = "allreduce" if len(tensors) == 1 else "grouped_allreduce"

    def fn(op_name: Optional[str], *arrays: np.ndarray) -> List[np.ndarray]:
        if when is not None:
            go, arrays = arrays[0], arrays[1:]
            if not bool(go):
                return [np.asarray(a) for a in arrays]
        bufs = [_to_buffer(a, reduce=True) for a in arrays]
        out = _wait(_rt.submit_allreduce(bufs, None, op_name, op, prescale, postscale, process_set,
                                         kind), process_set)
        outs = [out] if kind == "allreduce" else out
        return [_from_buffer(o, _np_dtype(d), reduce=True) for o, d in zip(outs, dtypes)]

    inputs = tensors if when is None else [tf.cast(when, tf.bool)] + tensors
    outs = _run(fn, inputs, dtypes, "HorovodAllreduce", name)
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return outs


def _is_float(t: tf.Tensor) -> bool:
    return t.dtype.is_floating or t.dtype.is_complex


def _needs_gradient(tensors: Sequence[tf.Tensor]) -> bool:
    """Whether to register the op's gradient: some input is floating, and a gradient can be asked
    for -- always while a graph is built (``tf.gradients`` may come later), eagerly only while a
    tape records (registering costs more than a small allreduce)."""
    if not any(_is_float(t) for t in tensors):
        return False
    return not tf.executing_eagerly() or _record.could_possibly_record()


def _grouped_allreduce_diff(tensors: Sequence[tf.Tensor], op: int, prescale: float,
                            postscale: float, name: Optional[str],
                            process_set: ProcessSet) -> List[tf.Tensor]:
    """The same, differentiable: the gradient is the allreduce of the gradient (same op, scales)."""
    if not _needs_gradient(tensors):
        return _reduce_np(tensors, op, prescale, postscale, name, process_set)

    @tf.custom_gradient
    def f(*xs):
        ys = _reduce_np(xs, op, prescale, postscale, name, process_set)

        def grad(*dys):
            return _reduce_np([tf.convert_to_tensor(d) for d in dys], op, prescale, postscale,
                              None, process_set)
        return ys, grad
    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _resolve(average: Optional[bool], op: Optional[int]) -> int:
    return _rt.resolve_op(average, op)


#: Horovod's error for Adasum on sparse gradients (``tf.IndexedSlices``).
ADASUM_SPARSE = ("The Adasum reduction does not currently support sparse tensors. As a workaround "
                 "please pass sparse_as_dense=True to DistributedOptimizer")


def _check_adasum(process_set: ProcessSet) -> None:
    """Horovod's restriction on ``op=Adasum`` on CPU: the ranks that reduce (here: the set's, as
    the runtime reduces over any set) are a power of two.  Raised where the op is called, on every
    rank alike, before anything is submitted."""
    n = process_set.size()
    if n is not None and n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` over the process set (default: Average) and return the result.

    A ``tf.IndexedSlices`` is reduced as Horovod does: its values and indices are allgathered
    (Average divides the values by the set's size), giving an ``IndexedSlices`` with every rank's
    rows.  Differentiable; ``compression`` applies on the wire (``Compression.fp16``)."""
    op = _resolve(average, op)
    # the common case first, checked cheapest first (a small allreduce costs little more)
    if type(tensor) is _EAGER and compression is Compression.none \
            and tensor._datatype_enum() in _DIRECT and not _record.could_possibly_record():
        if op == Adasum:
            _check_adasum(process_set)
        return _allreduce_eager(tensor, op, prescale_factor, postscale_factor, name, process_set)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError(ADASUM_SPARSE)
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with "
                                      "tf.IndexedSlices")
        return _allreduce_indexed_slices(tensor, op, name, process_set)
    if op == Adasum:
        _check_adasum(process_set)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _grouped_allreduce_diff([compressed], op, prescale_factor, postscale_factor, name,
                                  process_set)[0]
    return compression.decompress(out, ctx)


#: Eager tensors of these dtypes (their ``_datatype_enum()``) are reduced by ``_allreduce_eager``.
_EAGER = EagerTensor  # (not type(tf.constant(0)): that would start TensorFlow's context at import,
#                       after which a program can no longer set its thread pools)
_DIRECT = frozenset(d.as_datatype_enum for d in (tf.float16, tf.float32, tf.float64, tf.int8,
                                                  tf.uint8, tf.int16, tf.int32, tf.int64))


def _allreduce_eager(tensor: tf.Tensor, op: int, prescale: float, postscale: float,
                     name: Optional[str], process_set: ProcessSet) -> tf.Tensor:
    """``_reduce_np`` for the common case -- one eager tensor of a dtype the runtime reduces as it
    is, no tape recording, no compression -- without its per-call generality (a small allreduce
    costs about as much as that Python): the same checks, errors and result."""
    _check_set(process_set)
    # (a 0-d tensor's __array__() is a NumPy scalar, which torch.from_numpy refuses: np.asarray
    # makes it a 0-d array; any other tensor's is already an array, passed on without a copy)
    array = np.asarray(tensor.__array__())
    try:
        pending = _rt.submit_allreduce([torch.from_numpy(array)], None, name, op,
                                       prescale, postscale, process_set, "allreduce")
    except ValueError as exc:
        raise tf.errors.InvalidArgumentError(None, None, str(exc)) from exc
    return _tf_of(_wait(pending, process_set), tensor.dtype)


def _allreduce_indexed_slices(slices: tf.IndexedSlices, op: int, name: Optional[str],
                              process_set: ProcessSet) -> tf.IndexedSlices:
    if op not in (Average, Sum):
        raise NotImplementedError("Only Average and Sum are supported for tf.IndexedSlices; "
                                  "pass sparse_as_dense=True to reduce them as dense tensors")
    values = allgather(slices.values, name=f"{name}.values" if name else None,
                       process_set=process_set)
    indices = allgather(slices.indices, name=f"{name}.indices" if name else None,
                        process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, name: Optional[str] = None,
                      ignore_name_scope: bool = False) -> List[Any]:
    """Reduce a list of tensors as one op (one round trip, fused); returns a list."""
    op = _resolve(average, op)
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        if op == Adasum:  # before any of the list is reduced
            raise NotImplementedError(ADASUM_SPARSE)
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, process_set=process_set)
                for t in tensors]
    if op == Adasum:
        _check_adasum(process_set)
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped_allreduce_diff([p[0] for p in pairs], op, prescale_factor, postscale_factor,
                                   name, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ----------------------------------------------------------------------------- allgather

def _gather_np(tensors: Sequence[tf.Tensor], name: Optional[str],
               process_set: ProcessSet) -> List[tf.Tensor]:
    _check_set(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        _check_supported(t)
        if t.shape.rank == 0:
            raise ValueError("allgather requires a tensor of at least one dimension; "
                             "reshape a scalar with tf.reshape(t, [1])")
    dtypes = [t.dtype for t in tensors]
    kind = "allgather" if len(tensors) == 1 else "grouped_allgather"

    def fn(op_name: Optional[str], *arrays: np.ndarray) -> List[np.ndarray]:
        out = _wait(_rt.submit_allgather([_to_buffer(a) for a in arrays], op_name, process_set,
                                         kind), process_set)
        outs = [out] if kind == "allgather" else out
        return [_from_buffer(o, _np_dtype(d)) for o, d in zip(outs, dtypes)]

    outs = _run(fn, tensors, dtypes, "HorovodAllgather", name)
    for o, t in zip(outs, tensors):
        o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
    return outs


def _first_dims(tensors: Sequence[tf.Tensor], process_set: ProcessSet) -> List[tf.Tensor]:
    """Every rank's first dimension of each tensor (for the allgather gradient)."""
    dims = [tf.reshape(tf.shape(t, out_type=tf.int64)[0], [1]) for t in tensors]
    return _gather_np(dims, None, process_set)


def _grouped_allgather_diff(tensors: Sequence[tf.Tensor], name: Optional[str],
                            process_set: ProcessSet) -> List[tf.Tensor]:
    if not _needs_gradient(tensors):
        return _gather_np(tensors, name, process_set)

    @tf.custom_gradient
    def f(*xs):
        ys = _gather_np(xs, name, process_set)

        def grad(*dys):
            summed = _reduce_np([tf.convert_to_tensor(d) for d in dys], Average, 1.0, 1.0,
                                None, process_set)
            dims = _first_dims(xs, process_set)
            me = process_set.rank()
            n = process_set.size()
            return [tf.split(s, tf.reshape(tf.cast(d, tf.int32), [n]), num=n, axis=0)[me]
                    if n > 1 else s for s, d in zip(summed, dims)]
        return ys, grad
    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def allgather(tensor: Any, device_dense: str = "", device_sparse: str = "",
              name: Optional[str] = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ)."""
    if isinstance(tensor, tf.IndexedSlices):
        return tf.IndexedSlices(allgather(tensor.values, process_set=process_set),
                                allgather(tensor.indices, process_set=process_set),
                                dense_shape=tensor.dense_shape)
    return _grouped_allgather_diff([tf.convert_to_tensor(tensor)], name, process_set)[0]


def grouped_allgather(tensors: Sequence[Any], device_dense: str = "", device_sparse: str = "",
                      name: Optional[str] = None, process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False) -> List[tf.Tensor]:
    """Allgather a list of tensors as one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return _grouped_allgather_diff(tensors, name, process_set) if tensors else []


# ----------------------------------------------------------------------------- broadcast

def _broadcast_np(tensor: tf.Tensor, root_rank: int, name: Optional[str],
                  process_set: ProcessSet) -> tf.Tensor:
    _check_set(process_set)
    _check_supported(tensor)
    dtype = tensor.dtype

    def fn(op_name: Optional[str], a: np.ndarray) -> List[np.ndarray]:
        buf = _to_buffer(a).clone()
        out = _wait(_rt.submit_broadcast(buf, root_rank, op_name, process_set, True), process_set)
        return [_from_buffer(out, _np_dtype(dtype))]

    out = _run(fn, [tensor], [dtype], "HorovodBroadcast", name)[0]
    out.set_shape(tensor.shape)
    return out


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Global rank ``root_rank``'s ``tensor`` on every rank of the set (differentiable: the
    gradient is averaged over the set on the root, zero elsewhere)."""
    tensor = tf.convert_to_tensor(tensor)
    root_rank = int(root_rank)
    if not _needs_gradient([tensor]):
        return _broadcast_np(tensor, root_rank, name, process_set)

    @tf.custom_gradient
    def f(x):
        y = _broadcast_np(x, root_rank, name, process_set)

        def grad(dy):
            avg = _reduce_np([tf.convert_to_tensor(dy)], Average, 1.0, 1.0, None, process_set)[0]
            return avg if _life.rank() == root_rank else avg * 0
        return y, grad
    return f(tensor)


def broadcast_(variables: Any, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """Assign rank ``root_rank``'s values to ``variables`` (a list) in place; returns what each
    assignment returns (the variables eagerly, their assigned values in a graph), as Horovod's
    in-place broadcast."""
    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    out = [v.assign(_broadcast_np(tf.convert_to_tensor(v), int(root_rank),
                                  f"{name}.{i}" if name else None, process_set))
           for i, v in enumerate(vs)]
    return out[0] if single else out


# ----------------------------------------------------------------------------- alltoall

def _alltoall_np(tensor: tf.Tensor, splits: Optional[tf.Tensor], name: Optional[str],
                 process_set: ProcessSet) -> Tuple[tf.Tensor, tf.Tensor]:
    _check_set(process_set)
    _check_supported(tensor)
    dtype = tensor.dtype
    inputs = [tensor] + ([tf.cast(splits, tf.int64)] if splits is not None else [])

    def fn(op_name: Optional[str], a: np.ndarray,
           s: Optional[np.ndarray] = None) -> List[np.ndarray]:
        sp = None if s is None else [int(x) for x in np.asarray(s).reshape(-1)]
        out, recv = _wait(_rt.submit_alltoall(_to_buffer(a), sp, op_name, process_set,
                                              with_recv=True), process_set)
        return [_from_buffer(out, _np_dtype(dtype)), recv.numpy().astype(np.int32)]

    out, recv = _run(fn, inputs, [dtype, tf.int32], "HorovodAlltoall", name)
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    recv.set_shape([None])
    return out, recv


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send rows ``splits[i]`` of ``tensor`` to rank i and gather what every rank sent here.

    Returns the gathered tensor, or ``(output, received_splits)`` when ``splits`` is given, as
    Horovod's TensorFlow API does.  Differentiable: the gradient travels back along the rows
    each rank received."""
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("alltoall requires a tensor of at least one dimension")
    sp = None if splits is None else tf.convert_to_tensor(splits)
    if sp is not None and not (sp.dtype.is_integer):
        raise ValueError(f"alltoall: splits must contain integers (tf.int32), not {sp.dtype.name}")
    if not _needs_gradient([tensor]):
        out, recv = _alltoall_np(tensor, sp, name, process_set)
        return out if splits is None else (out, recv)

    @tf.custom_gradient
    def f(x):
        y, recv = _alltoall_np(x, sp, name, process_set)

        def grad(dy, _drecv=None):
            g, _ = _alltoall_np(tf.convert_to_tensor(dy), recv, None, process_set)
            return g
        return (y, recv), grad
    out, recv = f(tensor)
    return out if splits is None else (out, recv)


# ----------------------------------------------------------------------------- reducescatter

def _reducescatter_np(tensors: Sequence[tf.Tensor], op: int, prescale: float, postscale: float,
                      name: Optional[str], process_set: ProcessSet) -> List[tf.Tensor]:
    _check_set(process_set)
    dtypes = [t.dtype for t in tensors]
    kind = "reducescatter" if len(tensors) == 1 else "grouped_reducescatter"
    for t in tensors:
        _check_supported(t)
        if t.shape.rank == 0:
            raise ValueError("reducescatter does not support scalar tensors: the tensor must "
                             "have at least one dimension")

    def fn(op_name: Optional[str], *arrays: np.ndarray) -> List[np.ndarray]:
        out = _wait(_rt.submit_reducescatter([_to_buffer(a, reduce=True) for a in arrays], op_name,
                                             op, prescale, postscale, process_set, kind),
                    process_set)
        outs = [out] if kind == "reducescatter" else out
        return [_from_buffer(o, _np_dtype(d), reduce=True) for o, d in zip(outs, dtypes)]

    outs = _run(fn, tensors, dtypes, "HorovodReducescatter", name)
    for o, t in zip(outs, tensors):
        o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
    return outs


def _grouped_reducescatter_diff(tensors: Sequence[tf.Tensor], op: int, prescale: float,
                                postscale: float, name: Optional[str],
                                process_set: ProcessSet) -> List[tf.Tensor]:
    if not _needs_gradient(tensors):
        return _reducescatter_np(tensors, op, prescale, postscale, name, process_set)

    @tf.custom_gradient
    def f(*xs):
        ys = _reducescatter_np(xs, op, prescale, postscale, name, process_set)

        def grad(*dys):
            factor = prescale * postscale * (process_set.size() if op == Sum else 1)
            scaled = [tf.convert_to_tensor(d) * tf.cast(factor, d.dtype) if factor != 1.0
                      else tf.convert_to_tensor(d) for d in dys]
            return _gather_np(scaled, None, process_set)
        return ys, grad
    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over the set (Sum or Average) and return this rank's block of rows."""
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _grouped_reducescatter_diff([compressed], op, prescale_factor, postscale_factor, name,
                                      process_set)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None,
                          ignore_name_scope: bool = False) -> List[tf.Tensor]:
    """Reducescatter a list of tensors as one op."""
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    if not pairs:
        return []
    outs = _grouped_reducescatter_diff([p[0] for p in pairs], op, prescale_factor,
                                       postscale_factor, name, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ----------------------------------------------------------------------------- join, barrier

def join() -> tf.Tensor:
    """This rank is out of data: contribute zeros to the others' collectives until every rank
    joined.  Returns the last rank to join (as a tensor, like Horovod)."""
    return _run(lambda _name: [np.asarray(_rt.join(), dtype=np.int32)], [], [tf.int32],
                "HorovodJoin")[0]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set reached the barrier."""
    _run(lambda _name: (_rt.barrier(process_set), [np.int32(0)])[1], [], [tf.int32],
         "HorovodBarrier")


# ----------------------------------------------------------------------------- topology as ops

def _topology_op(value: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    """``value()`` as an int32 tensor, read when the op runs (an elastic job's world changes
    between the runs of one traced function), or at once eagerly."""
    if tf.executing_eagerly():
        return tf.constant(value(), dtype=tf.int32, name=name)
    out = tf.numpy_function(lambda: np.int32(value()), [], tf.int32, stateful=True,
                            name=name or "HorovodTopology")
    out.set_shape([])
    return out


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks in process set ``process_set_id`` (0: the job), as a tensor."""
    return _topology_op(lambda: _set(process_set_id).size(), name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    return _topology_op(_life.local_size, name)


def rank_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """This process's rank in process set ``process_set_id`` (0: the job), as a tensor."""
    return _topology_op(lambda: _set(process_set_id).rank(), name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    return _topology_op(_life.local_rank, name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this rank belongs to process set ``process_set_id``, else 0 (as a tensor)."""
    return _topology_op(lambda: int(bool(_set(process_set_id).included())), name)


def _set(process_set_id: int) -> ProcessSet:
    return global_process_set if process_set_id == 0 else _life.process_set_by_id(process_set_id)
