"""``horovod.spark.common.serialization``: `save(path)` and `load(path)` of the estimators and the
trained models, as pyspark.ml `MLWritable`/`MLReadable` (so they also work inside a saved
`Pipeline`).

The layout is Horovod 0.28.1's: `<path>/metadata` holds one line of JSON with the class, uid,
Spark version, a timestamp and the parameters set (`paramMap`) and defaulted
(`defaultParamMap`); each value is base64 of its cloudpickle (a TorchScript model: of the
`torch.jit.save` bytes), and `backend` and `store` are saved as null (they belong to the
machine and run, and are given again before `fit`). An instance with a store writes the file
through it; any other through Spark (`saveAsTextFile`), which `load` reads either way.
"""
from __future__ import annotations

import base64
import importlib
import io
import json
import os
import pickle
import time
from typing import Any, Dict, Optional

import cloudpickle
from pyspark.ml.util import DefaultParamsReader, MLReadable, MLReader, MLWritable, MLWriter

#: Parameters saved as null: rebuilt for each run of a pipeline.
NOT_SAVED = ("backend", "store")

#: (test, pack) pairs for values that must not be cloudpickled whole (a Keras 3 model): a value
#: for which `test(value)` is true is saved as `pack(value)`, a picklable object whose
#: `_horovod_restore()` gives the value back at load. Registered by the framework's package.
VALUE_CODECS: list = []


def register_codec(test: Any, pack: Any) -> None:
    VALUE_CODECS.append((test, pack))


def encode(name: str, value: Any) -> Optional[str]:
    """A parameter's value as base64 text (None for unset values and `NOT_SAVED` params)."""
    if value is None or name in NOT_SAVED:
        return None
    if name == "model" and type(value).__module__.startswith("torch.jit"):
        import torch

        scripted = io.BytesIO()
        torch.jit.save(value, scripted)
        value = scripted
    for test, pack in VALUE_CODECS:
        if test(value):
            value = pack(value)
            break
    return base64.b64encode(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def decode(name: str, text: Optional[str]) -> Any:
    if text is None:
        return None
    value = cloudpickle.loads(base64.b64decode(text))
    if name == "model" and isinstance(value, io.BytesIO):
        import torch

        value.seek(0)
        value = torch.jit.load(value)
    elif callable(getattr(value, "_horovod_restore", None)):
        value = value._horovod_restore()
    return value


class ParamsWriter(MLWriter):
    """Writes `<path>/metadata` for an estimator or model (see the module's docstring)."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        instance = self.instance
        text = json.dumps({
            "class": f"{type(instance).__module__}.{type(instance).__name__}",
            "timestamp": int(time.time() * 1000), "sparkVersion": self.sc.version,
            "uid": instance.uid,
            "paramMap": {p.name: encode(p.name, v) for p, v in instance._paramMap.items()},
            "defaultParamMap": {p.name: encode(p.name, v) for p, v in instance._defaultParamMap.items()},
        }, separators=(",", ":"))
        target = os.path.join(path, "metadata")
        store = instance.getStore() if hasattr(instance, "getStore") else None
        if store is not None:
            store.write_text(target, text)
        else:
            self.sc.parallelize([text], 1).saveAsTextFile(target)


class ParamsReader(MLReader):
    """Reads what `ParamsWriter` wrote back into a new instance of the saved class, which must
    be `cls` or a subclass of it."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        module, _, name = metadata["class"].rpartition(".")
        saved = getattr(importlib.import_module(module), name)
        if not (isinstance(saved, type) and issubclass(saved, self.cls)):
            raise TypeError(f"{path} holds a saved {metadata['class']}, not a "
                            f"{self.cls.__module__}.{self.cls.__name__}; load it with that class.")
        instance = saved()
        instance._resetUid(metadata["uid"])
        defaults: Dict[str, Any] = {}
        for key, target in (("defaultParamMap", defaults), ("paramMap", None)):
            for param_name, text in metadata[key].items():
                if not instance.hasParam(param_name):
                    raise ValueError(f"{path}: {metadata['class']} has no parameter {param_name!r} "
                                     "(saved by another version?).")
                value = decode(param_name, text)
                if target is None:
                    instance._set(**{param_name: value})
                else:
                    target[param_name] = value
            if target is not None:
                instance._setDefault(**target)
        instance._after_load()
        return instance


class Persistable(MLWritable, MLReadable):
    """`save(path)`/`write()` and `load(path)`/`read()` for the estimators and models."""

    def write(self) -> ParamsWriter:
        return ParamsWriter(self)

    @classmethod
    def read(cls) -> ParamsReader:
        return ParamsReader(cls)

    def _after_load(self) -> None:
        """Restore what separate pickles of the parameters cannot keep (e.g. an optimizer bound
        to the model's parameters)."""
