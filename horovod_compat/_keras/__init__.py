"""``horovod._keras``: the Keras side of ``horovod.tensorflow.keras`` and ``horovod.keras``, for
Keras 3 (the ``tf.keras`` of TensorFlow >= 2.16) and tf-keras (``TF_USE_LEGACY_KERAS=1``; both its
optimizers and its ``tf.keras.optimizers.legacy`` ones).

``create_distributed_optimizer`` returns an instance of a subclass of the user's optimizer class
(same name, same module, ``isinstance`` holds), made with ``from_config(optimizer.get_config())``
as Horovod does, whose gradients are reduced across ranks before they are applied:

* where they are reduced: in the gradient-computing methods Keras' ``minimize`` calls
  (tf-keras: ``compute_gradients``/``_compute_gradients``, ``get_gradients``; also
  ``_compute_gradients`` on Keras 3), as Horovod does; gradients handed straight to
  ``apply_gradients`` (Keras 3's ``model.fit``, custom loops) are reduced there (Keras 3: in
  ``apply``), and a loss scale optimizer around ours (Keras 3 or tf-keras) has them reduced
  before it checks that they are finite (``_reduced_before_loss_scaling``), so that every rank
  skips an overflow step together.  Gradients are reduced once per step either way.
* how: one grouped allreduce of the step's gradients (``horovod_compat.tensorflow.gradients``),
  traced into ``model.fit``'s ``tf.function`` like any other op; gradients of variables given to
  ``register_local_var`` stay local (divided by the set's size with ``scale_local_gradients``).
* ``backward_passes_per_step=N``: gradients are summed locally in variables for N steps (divided
  by N with ``average_aggregated_gradients``), reduced at the N-th, and applied then; the steps in
  between only count ``iterations`` (``tf.cond``, so it works inside ``tf.function``).
  ``opt._agg_helper.counter`` holds the number of passes since the last reduction, as in Horovod.

Keras 3 specifics: ``opt.variables()`` works as well as ``opt.variables`` and ``opt.lr`` is
``opt.learning_rate`` (Horovod-era code uses both); ``Model.compile`` accepts Horovod's
``experimental_run_tf_function=`` (ignored, as tf-keras ignores it) and compiles a model whose
optimizer is distributed with ``jit_compile=False`` (XLA cannot compile the collectives).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.common.ops import Adasum, Average, Sum
from horovod_compat.common.process_sets import ProcessSet, global_process_set
import horovod_compat.tensorflow.mpi_ops as _ops
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.aggregation import LocalGradientAggregationHelper
from horovod_compat.tensorflow.gradients import LocalVariables, reduce_gradients

__all__ = ["create_distributed_optimizer", "is_distributed_optimizer", "optimizer_flavor",
           "broadcast_global_variables", "allreduce", "allgather", "broadcast", "reducescatter",
           "load_model", "in_tf1_graph", "keras_session", "eval_in_session", "KERAS3",
           "TF_KERAS", "TF_KERAS_LEGACY"]

KERAS3 = "keras3"                  #: keras>=3 optimizers (``keras.optimizers.*``)
TF_KERAS = "tf_keras"              #: tf-keras optimizers (``tf_keras.optimizers.*``)
TF_KERAS_LEGACY = "tf_keras_legacy"  #: tf-keras OptimizerV2 (``tf_keras.optimizers.legacy.*``)


def optimizer_flavor(optimizer: Any) -> str:
    """Which Keras ``optimizer`` belongs to: ``KERAS3``, ``TF_KERAS`` or ``TF_KERAS_LEGACY``."""
    modules = [getattr(k, "__module__", "") or "" for k in type(optimizer).__mro__]
    if any(m.endswith("optimizer_v2") for m in modules):
        return TF_KERAS_LEGACY
    if any(m.startswith("tf_keras.") for m in modules):
        return TF_KERAS
    if any(m.startswith("keras.") for m in modules) and hasattr(optimizer, "stateless_apply"):
        return KERAS3
    raise ValueError(f"{type(optimizer).__name__} is not a Keras optimizer (Keras 3 or tf-keras): "
                     f"{optimizer!r}")


def is_distributed_optimizer(optimizer: Any) -> bool:
    """True for an optimizer made by ``create_distributed_optimizer``."""
    return getattr(type(optimizer), "_hvd_distributed", False)


# ----------------------------------------------------------------------------- small helpers

# Our methods run as plain Python when a user's tf.function calls them (AutoGraph would otherwise
# rewrite them, and everything they call, on every trace).
_not_converted = tf.autograph.experimental.do_not_convert


class _CallableList(list):
    """A list that can also be called (``opt.variables`` and ``opt.variables()`` both work)."""

    def __call__(self) -> "_CallableList":
        return self


def _initialize_in_keras_session(variable: tf.Variable) -> None:
    """In a TF1 graph, initialize ``variable`` in Keras' session, which initializes only the
    variables Keras made itself (``eval_in_session``); elsewhere nothing is needed."""
    eval_in_session(variable.initializer)


class _Settings:
    """The wrapper's Horovod parameters and bookkeeping.  A plain object on purpose: Keras 3 and
    TensorFlow track lists, dicts and variables assigned to an optimizer's attributes (they would
    become optimizer variables or checkpoint dependencies)."""

    def __init__(self, compression: Any, sparse_as_dense: bool, op: int,
                 gradient_predivide_factor: float, groups: Any, process_set: ProcessSet,
                 scale_local_gradients: bool) -> None:
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.local = LocalVariables()     # the variables registered as local
        self.pending = False              # gradients from our compute path: already reduced


# ----------------------------------------------------------------------------- the wrapper

class _DistributedOptimizerMixin:
    """What every distributed optimizer class adds (placed before the user's class in the MRO)."""

    _hvd_distributed = True
    _hvd_init_args: Dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hvd_setup(**type(self)._hvd_init_args)

    def _hvd_setup(self, compression: Any, sparse_as_dense: bool, op: int,
                   gradient_predivide_factor: float, backward_passes_per_step: int,
                   average_aggregated_gradients: bool, groups: Any, process_set: ProcessSet,
                   scale_local_gradients: bool) -> None:
        self._hvd = _Settings(compression, sparse_as_dense, op, gradient_predivide_factor,
                              groups, process_set, scale_local_gradients)
        self._agg_helper = (LocalGradientAggregationHelper(backward_passes_per_step,
                                                           average_aggregated_gradients,
                                                           _initialize_in_keras_session)
                            if backward_passes_per_step > 1 else None)

    # -- Horovod's API on the optimizer

    @property
    def process_set(self) -> ProcessSet:
        return self._hvd.process_set

    @property
    def scale_local_gradients(self) -> bool:
        return self._hvd.scale_local_gradients

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient on this worker (not reduced across ranks)."""
        self._hvd.local.register(var)

    # -- reduction

    def _hvd_reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """One grouped reduction of the global gradients; local ones scaled as configured."""
        s = self._hvd
        return reduce_gradients(grads, variables, s.local, s.scale_local_gradients, op=s.op,
                                compression=s.compression, sparse_as_dense=s.sparse_as_dense,
                                gradient_predivide_factor=s.gradient_predivide_factor,
                                process_set=s.process_set)

    @_not_converted
    def _allreduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """Horovod's hook: reduce (or, with ``backward_passes_per_step``, aggregate) ``grads``."""
        grads, variables = list(grads), list(variables)
        if self._agg_helper is not None:
            return self._agg_helper.aggregate(grads, variables, self._hvd_reduce)
        return self._hvd_reduce(grads, variables)

    def _hvd_grads_to_apply(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        if self._hvd.pending:  # already reduced by _compute_gradients & co.
            self._hvd.pending = False
            return grads
        return self._allreduce(grads, variables)

    def _hvd_computed(self, grads_and_vars: Iterable[Any]) -> List[Any]:
        """Reduce what a gradient-computing method of the base class returned."""
        pairs = list(grads_and_vars)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        reduced = self._allreduce(list(grads), list(variables))
        self._hvd.pending = True
        return list(zip(reduced, variables))

    def _hvd_gated(self, apply_fn: Callable[[], Any], iterations: Any,
                   grads: Sequence[Any]) -> tf.Tensor:
        """``apply_fn`` on the steps that reduced; ``iterations`` counted on the others."""
        return self._agg_helper.gated(apply_fn, grads, lambda: iterations.assign_add(1))


class _Keras3Mixin(_DistributedOptimizerMixin):
    """Keras 3: ``apply`` (which ``apply_gradients`` and ``model.fit`` call) reduces first."""

    @property
    def variables(self) -> _CallableList:  # type: ignore[override]
        return _CallableList(super().variables)

    @property
    def lr(self) -> Any:
        """The learning rate as tf-keras gave it: the ``tf.Variable`` itself (so that
        ``tf.keras.backend.set_value(opt.lr, x)`` and ``opt.lr.numpy()`` work)."""
        inner = getattr(self._learning_rate, "_value", None)
        return inner if isinstance(inner, tf.Variable) else self.learning_rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    @_not_converted
    def apply_gradients(self, grads_and_vars: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        # Horovod-era callers pass tf-keras' experimental_aggregate_gradients= / name=
        pairs = list(grads_and_vars)
        if not pairs:
            return self.iterations
        grads, variables = zip(*pairs)
        self.apply(list(grads), list(variables))
        return self._iterations

    @_not_converted
    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads, trainable_variables)  # Keras' own error
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
        grads = self._hvd_grads_to_apply(grads, variables)
        if self._agg_helper is None:
            return super().apply(grads, trainable_variables)
        if not self.built:
            self.build(variables)
            self.built = True
        parent_apply = super().apply
        self._hvd_gated(lambda: parent_apply(grads, trainable_variables), self._iterations, grads)
        return None

    @_not_converted
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Optional[tf.GradientTape] = None) -> List[Any]:
        """Horovod's (tf-keras') ``_compute_gradients``: reduced ``(gradient, variable)`` pairs."""
        if not callable(loss) and tape is None:
            raise ValueError("`tape` is required when a `Tensor` loss is passed.")
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        grads = tape.gradient(loss, var_list, output_gradients=grad_loss)
        return self._hvd_computed(zip(grads, var_list))


class _TfKerasApplyMixin(_DistributedOptimizerMixin):
    """tf-keras, both kinds: ``apply_gradients`` reduces what was not reduced yet, then applies
    (or, between reductions of ``backward_passes_per_step``, only counts ``iterations``)."""

    def _hvd_build(self, pairs: List[Any]) -> None:
        """Create the slots before the ``tf.cond`` (as ``apply_gradients`` would)."""
        with tf.init_scope():
            self.build([v for _, v in pairs])

    @_not_converted
    def apply_gradients(self, grads_and_vars: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        if not pairs:
            return super().apply_gradients(pairs, *args, **kwargs)
        grads, variables = (list(t) for t in zip(*pairs))
        grads = self._hvd_grads_to_apply(grads, variables)
        pairs = list(zip(grads, variables))
        if self._agg_helper is None:
            return super().apply_gradients(pairs, *args, **kwargs)
        self._hvd_build(pairs)
        parent = super().apply_gradients
        applied = self._hvd_gated(lambda: parent(pairs, *args, **kwargs), self.iterations, grads)
        # a TF1 graph (Keras' get_updates) runs what this returns: the gated step
        return applied.op if in_tf1_graph() else self.iterations


class _TfKerasMixin(_TfKerasApplyMixin):
    """tf-keras optimizers (``tf_keras.optimizers.Optimizer``): ``minimize`` ->
    ``compute_gradients`` (reduces here) -> ``apply_gradients``."""

    @_not_converted
    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
        return self._hvd_computed(super().compute_gradients(loss, var_list, tape))

    @_not_converted
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Any]:
        """Horovod's name for it (OptimizerV2's), with ``grad_loss``."""
        if grad_loss is None:
            return self.compute_gradients(loss, var_list, tape)
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch(var_list)
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        grads = tape.gradient(loss, var_list, grad_loss)
        return self._hvd_computed(zip(grads, var_list))


class _TfKerasLegacyMixin(_TfKerasApplyMixin):
    """tf-keras ``OptimizerV2`` (``tf.keras.optimizers.legacy``): ``minimize`` ->
    ``_compute_gradients`` (reduces here); graph-mode Keras -> ``get_gradients``."""

    @_not_converted
    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
        return self._compute_gradients(loss, var_list, None, tape)

    @_not_converted
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Any]:
        return self._hvd_computed(super()._compute_gradients(loss, var_list, grad_loss,
                                                             tape=tape))

    @_not_converted
    def get_gradients(self, loss: Any, params: Any) -> List[Any]:
        grads = super().get_gradients(loss, params)
        pairs = self._hvd_computed(zip(grads, params))
        return [g for g, _ in pairs]

    def _hvd_build(self, pairs: List[Any]) -> None:
        with tf.init_scope():
            self._create_all_weights([v for g, v in pairs if g is not None])


_MIXINS = {KERAS3: _Keras3Mixin, TF_KERAS: _TfKerasMixin, TF_KERAS_LEGACY: _TfKerasLegacyMixin}


def create_distributed_optimizer(optimizer: Any, name: Optional[str] = None,
                                 device_dense: str = "", device_sparse: str = "",
                                 compression: Any = Compression.none,
                                 sparse_as_dense: bool = False,
                                 gradient_predivide_factor: float = 1.0, op: int = Average,
                                 backward_passes_per_step: int = 1,
                                 average_aggregated_gradients: bool = False,
                                 groups: Any = None,
                                 process_set: ProcessSet = global_process_set,
                                 scale_local_gradients: bool = True,
                                 num_groups: int = 0, keras: Any = None) -> Any:
    """A distributed copy of the Keras ``optimizer`` (see the module docstring).

    ``keras`` (Horovod passed its Keras module first) and ``num_groups``/``groups`` are accepted:
    every gradient already travels in one grouped allreduce."""
    if op == Adasum:  # Horovod 0.28.1 refuses it for Keras optimizers too
        raise ValueError("op == Adasum is not supported yet with Keras")
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups >= 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    flavor = optimizer_flavor(optimizer)
    if flavor != KERAS3:
        _install_tf_keras_loss_scale_patch()
    base = type(optimizer)
    if is_distributed_optimizer(optimizer):
        # wrapping twice would reduce twice: rewrap the original class instead
        base = next(k for k in base.__mro__[1:] if not issubclass(k, _DistributedOptimizerMixin))
    init_args = dict(compression=compression, sparse_as_dense=bool(sparse_as_dense), op=op,
                     gradient_predivide_factor=float(gradient_predivide_factor),
                     backward_passes_per_step=int(backward_passes_per_step),
                     average_aggregated_gradients=bool(average_aggregated_gradients),
                     groups=groups, process_set=process_set,
                     scale_local_gradients=bool(scale_local_gradients))
    # Same name and module as the user's class: a model saved with it loads without Horovod.
    cls = type(base.__name__, (_MIXINS[flavor], base),
               {"__module__": base.__module__, "__qualname__": base.__qualname__,
                "_hvd_init_args": init_args})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


# ----------------------------------------------------------------------------- Keras 3 compile

_compile_patch_lock = threading.Lock()


def _install_keras3_compile_patch() -> None:
    """Keras 3's ``Model.compile``: accept (and ignore) Horovod's
    ``experimental_run_tf_function=``, and compile without XLA when the optimizer is distributed.

    Patched where Keras defines it (``Trainer.compile``), so that Keras' check for models that
    override ``compile`` still sees the original owner."""
    try:
        import keras
    except ImportError:  # pragma: no cover - Keras 3 ships with TensorFlow >= 2.16
        return
    if not str(getattr(keras, "__version__", "0")).startswith("3"):
        return
    owner = next((k for k in keras.Model.__mro__ if "compile" in vars(k)), None)
    if owner is None:
        return
    with _compile_patch_lock:
        original = vars(owner)["compile"]
        if getattr(original, "_hvd_patched", False):
            return
        signature = inspect.signature(original)

        @functools.wraps(original)
        def compile(self, *args, experimental_run_tf_function: Any = None, **kwargs):  # noqa: A001
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                return original(self, *args, **kwargs)
            arguments = bound.arguments
            if is_distributed_optimizer(arguments.get("optimizer")):
                jit = arguments.get("jit_compile", "auto")
                if jit is True:
                    warnings.warn("jit_compile=True cannot compile Horovod's collectives (XLA); "
                                  "compiling with jit_compile=False", stacklevel=2)
                if jit:
                    arguments["jit_compile"] = False
            return original(*bound.args, **bound.kwargs)

        compile._hvd_patched = True  # type: ignore[attr-defined]
        setattr(owner, "compile", compile)


_install_keras3_compile_patch()


@contextlib.contextmanager
def _reduced_before_loss_scaling(inner: Any, grads: Sequence[Any],
                                 variables: Sequence[Any]) -> Iterator[List[Any]]:
    """A loss scale optimizer around a distributed one (``inner``) applies a step, or skips it and
    lowers the scale, as its gradients are finite or not, and only then calls ``inner``, which
    reduces: a rank whose own gradients overflowed would skip a reduction that the others made,
    and from then on the ranks' reductions would pair different steps (and their loss scales
    differ).  So the gradients are reduced here, before the check -- unless ``inner`` already
    reduced them (``minimize`` -> ``compute_gradients``) -- and ``inner`` applies them as they
    come; its "already reduced" mark is cleared afterwards, also when the step was skipped."""
    try:
        if inner._hvd.pending:  # reduced when they were computed
            yield list(grads)
        else:
            reduced = inner._allreduce(list(grads), list(variables))
            inner._hvd.pending = True  # the inner optimizer's apply: already reduced
            yield reduced
    finally:
        inner._hvd.pending = False  # (a skipped step never reached the inner apply)


def _install_keras3_loss_scale_patch() -> None:
    """Keras 3's ``LossScaleOptimizer`` around a distributed optimizer -- what ``compile`` makes of
    ``hvd.DistributedOptimizer(...)`` under the ``mixed_float16`` policy, or
    ``LossScaleOptimizer(hvd.DistributedOptimizer(...))``: reduce the (scaled) gradients before
    it checks that they are finite (``_reduced_before_loss_scaling``).  Keras expects them so (its
    comment for ``tf.distribute``: "each replica computed the same `finite` value, since `grads`
    is all-reduced across replicas")."""
    try:
        from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
    except ImportError:  # pragma: no cover - not Keras 3
        return
    with _compile_patch_lock:
        original = vars(LossScaleOptimizer)["apply"]
        if getattr(original, "_hvd_patched", False):
            return

        @functools.wraps(original)
        def apply(self, grads, trainable_variables=None):
            inner = self.inner_optimizer
            if not is_distributed_optimizer(inner) or (
                    trainable_variables is None and not self.built):
                return original(self, grads, trainable_variables)
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
            with _reduced_before_loss_scaling(inner, grads, variables) as reduced:
                return original(self, reduced, trainable_variables)

        apply._hvd_patched = True  # type: ignore[attr-defined]
        setattr(LossScaleOptimizer, "apply", apply)


def _install_tf_keras_loss_scale_patch() -> None:
    """tf-keras' loss scale optimizers (``LossScaleOptimizer`` for ``optimizers.legacy``,
    ``LossScaleOptimizerV3`` for the others) around a distributed optimizer, whose
    ``apply_gradients`` a custom loop calls with the tape's gradients: reduce them before the
    finiteness check, as for Keras 3 (``model.fit`` and ``minimize`` reduce them earlier, in
    ``compute_gradients``).  Installed when the first tf-keras distributed optimizer is made."""
    try:
        from tf_keras.src.mixed_precision import loss_scale_optimizer as lso
    except ImportError:  # pragma: no cover - tf-keras is not installed
        return
    with _compile_patch_lock:
        for cls in (lso.LossScaleOptimizer, lso.LossScaleOptimizerV3):
            original = vars(cls)["apply_gradients"]
            if getattr(original, "_hvd_patched", False):
                continue
            setattr(cls, "apply_gradients", _tf_keras_apply_gradients(original))


def _tf_keras_apply_gradients(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        inner = self.inner_optimizer
        pairs = list(grads_and_vars)
        if not is_distributed_optimizer(inner) or not pairs:
            return original(self, pairs, *args, **kwargs)
        grads, variables = zip(*pairs)
        with _reduced_before_loss_scaling(inner, grads, variables) as reduced:
            return original(self, list(zip(reduced, variables)), *args, **kwargs)

    apply_gradients._hvd_patched = True  # type: ignore[attr-defined]
    return apply_gradients


_install_keras3_loss_scale_patch()


# ----------------------------------------------------------------------------- value collectives

def in_tf1_graph() -> bool:
    """Whether ops are being built into a TF1 graph that a session runs (tf-keras after
    ``tf.compat.v1.disable_eager_execution()``) -- not eagerly, and not inside a ``tf.function``
    (a traced ``train_step``), whose values only exist when the function runs."""
    return not tf.executing_eagerly() and not tf.inside_function()


def keras_session() -> Any:
    """tf-keras' TF1 session (``tf.compat.v1.keras.backend.get_session()``, which also
    initializes the graph's uninitialized variables), or None where Keras has none (Keras 3)."""
    backend = getattr(getattr(tf.compat.v1, "keras", None), "backend", None)
    get_session = getattr(backend, "get_session", None)
    return get_session() if get_session is not None else None


def eval_in_session(value: Any) -> Any:
    """Horovod's ``_eval``: eagerly ``value`` itself (already computed); in a TF1 graph -- tf-keras
    after ``tf.compat.v1.disable_eager_execution()`` -- the op or tensor run in Keras' session,
    which gives the NumPy value (None for an op), as Horovod's Keras helpers return it.  Without a
    Keras session (Keras 3 builds no TF1 graphs), or inside a ``tf.function``, the graph op or
    tensor is returned."""
    if value is None or not in_tf1_graph():
        return value
    session = keras_session()
    return session.run(value) if session is not None else value


def _as_tensor(value: Any, name: Optional[str]) -> tf.Tensor:
    if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "_value"):
        return tf.convert_to_tensor(value)
    return tf.constant(value, name=name)


def broadcast_global_variables(backend: Any, root_rank: int) -> Any:
    """TF1 graphs only (run in Keras' session): eagerly this raises, as Horovod does (use the
    ``BroadcastGlobalVariablesCallback`` or ``hvd.broadcast_variables``)."""
    from horovod_compat.tensorflow.functions import broadcast_global_variables as _bgv

    return eval_in_session(_bgv(root_rank))


# The value collectives return a tensor eagerly, and the value (run in Keras' session) in a TF1
# graph, as Horovod's (``eval_in_session``).

def allreduce(backend: Any, value: Any, name: Optional[str], average: Optional[bool],
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[int] = None,
              compression: Any = Compression.none) -> Any:
    return eval_in_session(_ops.allreduce(
        _as_tensor(value, name), average=average, op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, compression=compression))


def allgather(backend: Any, value: Any, name: Optional[str]) -> Any:
    return eval_in_session(_ops.allgather(_as_tensor(value, name)))


def broadcast(backend: Any, value: Any, root_rank: int, name: Optional[str]) -> Any:
    return eval_in_session(_ops.broadcast(_as_tensor(value, name), root_rank))


def reducescatter(backend: Any, value: Any, name: Optional[str], op: int = Average) -> Any:
    return eval_in_session(_ops.reducescatter(_as_tensor(value, name), op=op))


# ----------------------------------------------------------------------------- load_model

def _factory_class(name: str, factory: Callable[..., Any]) -> type:
    """Keras 3 rebuilds objects with ``cls.from_config(config)``; Horovod-era ``custom_objects``
    are often plain functions ``**config -> optimizer`` (tf-keras accepted those)."""
    return type(name, (), {"from_config": classmethod(
        lambda cls, config, custom_objects=None: factory(**config))})


def _copy_optimizer_state(source: Any, target: Any, variables: List[Any], flavor: str) -> None:
    """Give ``target`` (fresh, same class and config) the loaded ``source``'s variables."""
    if flavor == TF_KERAS_LEGACY:
        src = list(source.variables())
        if not src:
            return
        with tf.init_scope():
            target._create_all_weights(variables)
        dst = list(target.variables())
    else:
        src = list(source.variables)
        if flavor == KERAS3 and not source.built:
            return
        if flavor == TF_KERAS and not getattr(source, "_built", False):
            return
        with tf.init_scope():
            target.build(variables)
        dst = list(target.variables)
    if len(src) != len(dst) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(src, dst)):
        raise ValueError(f"cannot carry the loaded optimizer's state over to the distributed "
                         f"optimizer: {len(src)} variables against {len(dst)}")
    for s, d in zip(src, dst):
        d.assign(s)


def load_model(keras: Any, wrap_optimizer: Callable[[type], Callable[..., Any]], filepath: Any,
               custom_optimizers: Optional[Sequence[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, legacy_opts: bool = False,
               compression: Any = Compression.none) -> Any:
    """``keras.models.load_model`` with the model's optimizer made distributed (its state kept).

    tf-keras: Horovod's way -- the optimizer classes are passed as ``custom_objects`` that build
    distributed optimizers, so Keras restores the state into them.  Keras 3 (which rebuilds its
    own optimizers by module path): the loaded optimizer is wrapped afterwards and its variables
    copied over."""
    keras3 = keras.optimizers.Optimizer.__module__.startswith("keras.")
    objects: Dict[str, Any] = {}
    if not keras3:
        base = keras.optimizers.legacy.Optimizer if legacy_opts else keras.optimizers.Optimizer
        for sub in base.__subclasses__():
            objects[sub.__name__.lower()] = wrap_optimizer(sub)
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls if keras3 else wrap_optimizer(cls)
    for key, obj in (custom_objects or {}).items():
        if keras3 and callable(obj) and not hasattr(obj, "from_config") \
                and not inspect.isclass(obj) and _returns_optimizer_hint(obj):
            obj = _factory_class(key, obj)
        objects[key] = obj
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or is_distributed_optimizer(optimizer):
        return model
    try:
        flavor = optimizer_flavor(optimizer)
    except ValueError:
        return model
    wrapped = create_distributed_optimizer(optimizer, compression=compression)
    _copy_optimizer_state(optimizer, wrapped, list(model.trainable_variables), flavor)
    model.optimizer = wrapped
    if hasattr(model, "train_function"):
        model.train_function = None
    if keras3 and getattr(model, "jit_compile", False):
        model.jit_compile = False
    return model


def _returns_optimizer_hint(fn: Callable[..., Any]) -> bool:
    """A custom object that is a function taking ``**kwargs`` (the shape of Horovod's documented
    ``lambda **kwargs: hvd.DistributedOptimizer(MyOptimizer(**kwargs))``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
