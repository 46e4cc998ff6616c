"""What Horovod's Keras pieces need to know about a Keras model whose weights may not exist yet.

A ``Sequential`` without an input shape and a subclassed model build on their first call, under
Keras 3 and tf-keras alike; before that they have no weights (tf-keras' ``Sequential`` even raises
when asked for them). The broadcast callback (``horovod_compat._keras.callbacks``) and
``TensorFlowKerasState`` (``.elastic``) use this module for:

* ``model_weights`` / ``optimizer_variables``: what a rank has now (nothing before the build);
* ``on_first_build``: run an action (a broadcast) right after the model's first call created its
  weights, before the step that made the call reads them;
* ``build_like_source``: on the ranks whose model (or optimizer) is not built while another rank's
  is, build it from that rank's input shapes (and create the optimizer's slots), so that every
  rank has the same variables to broadcast: a worker that joins an elastic job with an unbuilt
  model, or the ranks that start afresh while rank 0 loaded a checkpoint.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from horovod_compat.common.lifecycle import rank

from .functions import allgather_object, broadcast_object

__all__ = ["model_weights", "optimizer_variables", "on_first_build", "counts", "build_like_source",
           "build_spec", "build_like", "build_optimizer"]

#: The attribute of ``on_first_build``'s wrapper that holds its pending actions.
_ACTIONS = "_horovod_on_first_build"


def model_weights(model: Any) -> List[Any]:
    """The model's weights; none before it builds. Keras 3's ``weights`` leave out random-seed
    states, so each rank keeps its own dropout randomness."""
    try:
        weights = getattr(model, "weights", None)
    except ValueError:  # tf-keras: "Weights for model ... have not yet been created"
        return []
    if weights is None:
        weights = getattr(model, "variables", [])
    return list(weights)


def optimizer_variables(optimizer: Any) -> List[Any]:
    """The optimizer's variables (a property on Keras 3, a method on tf-keras); none before its
    first step creates its slots."""
    if optimizer is None:
        return []
    variables = getattr(optimizer, "variables", None)
    if callable(variables):
        variables = variables()
    return list(variables or [])


def on_first_build(model: Any, owner: Any, action: Callable[[], None]) -> None:
    """Run ``action()`` once, right after the model's first call created its weights, before the
    step that made the call reads them. Every rank must arm the same actions in the same order
    (they are collectives); arming again for the same ``owner`` replaces its action, so a
    restarted ``fit`` or a second sync does not add one.

    * tf-keras creates and initialises a layer's weights at once, also while the step is being
      traced (``tf.init_scope``): the action runs then, eagerly, before the traced step first runs.
    * Keras 3 may first build the model in a symbolic call, in a stateless scope that drops
      assignments to variables, or create its weights in the trace as tf.function variables that
      get their values once the trace ends (TensorFlow then traces the step again). The action
      waits for the first call that finds the weights holding their values.
    * A step run eagerly (``run_eagerly=True``) used this rank's own weights in that call; it is
      made again after the action (a layer that counts its calls sees one more).
    """
    armed = model.__dict__.get("call")
    actions: Optional[Dict[int, Callable[[], None]]] = getattr(armed, _ACTIONS, None)
    if actions is not None:
        actions[id(owner)] = action
        return
    actions = {id(owner): action}
    call = model.call

    def first_call(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        variables = model_weights(model)
        if not variables or _in_keras_stateless_scope() or not _hold_values(variables):
            return out
        del model.call  # the model's own call from now on (later traces, saving)
        with tf.init_scope():
            for act in list(actions.values()):
                act()
        return call(*args, **kwargs) if tf.executing_eagerly() else out

    setattr(first_call, _ACTIONS, actions)
    model.call = first_call


def _in_keras_stateless_scope() -> bool:
    """Whether this runs in Keras 3's ``StatelessScope`` (a symbolic call that builds a model):
    assignments to variables there are recorded and dropped. Keras 3 has no public way to ask;
    if that module is not loaded, nothing runs in it."""
    scope = sys.modules.get("keras.src.backend.common.stateless_scope")
    return bool(scope is not None and scope.in_stateless_scope())


def _hold_values(variables: List[Any]) -> bool:
    """Whether every variable already holds a value of its shape (read eagerly)."""
    with tf.init_scope():
        return all(np.shape(v.numpy()) == tuple(v.shape) for v in variables)


def build_spec(model: Any) -> Any:
    """The shapes and dtypes a built model was first called with, in plain picklable values
    (``build_like`` takes them), or None where the model does not record them."""
    save_spec = getattr(model, "save_spec", None)
    if callable(save_spec):  # tf-keras: TensorSpecs of the first call's (args, kwargs)
        spec = save_spec(dynamic_batch=True)
        if spec is None:
            return None
        call = (list(spec[0]), dict(spec[1]))
        return ("tf_keras", tf.nest.map_structure(lambda _: 0, call),
                [(tuple(s.shape.as_list()), s.dtype.name) for s in tf.nest.flatten(call)])
    shapes = getattr(model, "_build_shapes_dict", None)  # Keras 3: {"<argument>_shape": shape}
    if shapes:
        return ("keras3", {name: tuple(shape) for name, shape in shapes.items()}, None)
    return None


def build_like(model: Any, spec: Any) -> None:
    """Build ``model`` by calling it once, eagerly, on zeros of ``spec``'s shapes (a batch of one
    where the batch size is free); its weights get this rank's initial values."""
    def zeros(shape: Any, dtype: str = "float32") -> tf.Tensor:
        return tf.zeros([1 if d is None else d for d in shape], dtype=dtype)

    kind, structure, leaves = spec
    with tf.init_scope():
        if kind == "tf_keras":
            args, kwargs = tf.nest.pack_sequence_as(structure, [zeros(*leaf) for leaf in leaves])
            model(*args, **kwargs)
        elif len(structure) == 1:  # Keras 3, one input argument
            model(zeros(next(iter(structure.values()))))
        else:
            model(**{name[:-len("_shape")]: zeros(shape) for name, shape in structure.items()})


def build_optimizer(optimizer: Any, variables: List[Any]) -> None:
    """Create the optimizer's slots for ``variables`` now, as its first step would."""
    with tf.init_scope():
        if hasattr(optimizer, "_create_all_weights"):  # tf-keras legacy optimizers
            optimizer._create_all_weights(variables)
        else:  # Keras 3 and tf-keras optimizers
            optimizer.build(variables)


def counts(model: Any, optimizer: Any = None) -> List[Tuple[int, int]]:
    """Every rank's (model weights, optimizer variables) counts (a collective)."""
    return [tuple(c) for c in allgather_object(
        (len(model_weights(model)), len(optimizer_variables(optimizer))))]


def build_like_source(model: Any, optimizer: Any, every: Sequence[Tuple[int, int]],
                      source: int, what: str) -> None:
    """Given ``every`` rank's counts, build this rank's model from rank ``source``'s input shapes
    if it has no weights while ``source``'s model has, and (with an ``optimizer``) create its
    slots if it has fewer variables than the most any rank has. Every rank calls this (one
    broadcast of ``source``'s input shapes). ``what`` names the caller in the error raised when
    ``source``'s model does not record its input shapes."""
    spec = broadcast_object(build_spec(model) if rank() == source else None, root_rank=source)
    mine = every[rank()]
    if mine[0] == 0 and every[source][0] > 0:
        if spec is None:
            raise ValueError(
                f"{what}: this rank's model has no weights yet, rank {source}'s has "
                f"{every[source][0]}, and its model does not record the shapes it was built with; "
                "build the model on every rank first (model.build(input_shape), or one fit step "
                "as Horovod's elastic Keras example does)")
        build_like(model, spec)
    if optimizer is not None and mine[1] < max(o for _, o in every):
        build_optimizer(optimizer, model.trainable_variables)
