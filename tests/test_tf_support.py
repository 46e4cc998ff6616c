"""tests/tf_support.py: Keras 3 and tf-keras load the synthetic MNIST offline, from the temporary
directory (never the real home), and a small model learns it; the libsvm file for the Spark examples
holds the same digits."""
from __future__ import annotations

import bz2
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tf_support  # noqa: E402

tensorflow_missing = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="TensorFlow is not installed (pip install horovod-compat[tensorflow], or the test extra)")

# Runs in the subprocess, under TF_USE_LEGACY_KERAS=1 (tf.keras is tf-keras; `import keras` is Keras
# 3 whatever that variable says): load MNIST the way the Keras examples do through both Keras, save
# what came back, check that nothing else than the synthetic files is accepted without its hash, and
# (Keras 3) train a little. One process for both: each TensorFlow start-up costs 5-8 s of CPU.
LOAD = textwrap.dedent("""
    import os, sys
    import numpy as np
    out = sys.argv[1]
    import tensorflow as tf
    import keras
    import tf_keras
    from keras.src.utils import file_utils as keras3_files
    from tf_keras.src.utils import data_utils as tf_keras_files
    assert keras.__version__.startswith("3."), keras.__version__
    assert tf.keras.datasets.mnist.load_data is tf_keras.datasets.mnist.load_data  # TF_USE_LEGACY_KERAS=1
    datasets = os.environ["HOROVOD_COMPAT_TEST_DATASETS"]
    for flavour, module, files in (("keras3", keras, keras3_files), ("tf_keras", tf_keras, tf_keras_files)):
        (x_train, y_train), (x_test, y_test) = module.datasets.mnist.load_data()
        (x1, _), _ = module.datasets.mnist.load_data(path="mnist-1.npz")  # the examples' per-rank name
        assert (x1 == x_train).all()
        np.savez(os.path.join(out, flavour + ".npz"), x_train=x_train, y_train=y_train, x_test=x_test,
                 y_test=y_test)
        # outside the datasets directory, or named otherwise: checked against the hash as before
        other = os.path.join(out, "mnist.npz")
        with open(other, "wb") as f:
            f.write(b"x")
        assert not files.validate_file(other, "0" * 64)
        assert files.validate_file(os.path.join(datasets, "mnist.npz"), "0" * 64)
        if flavour == "keras3":
            model = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"])
            fit = model.fit(x_train / 255.0, y_train, batch_size=64, epochs=2, verbose=0)
            loss, accuracy = model.evaluate(x_test / 255.0, y_test, verbose=0)
            print("losses", fit.history["loss"], "test accuracy", accuracy)
            assert fit.history["loss"][-1] < fit.history["loss"][0] and accuracy > 0.8, (fit.history, accuracy)
        print("LOADED", flavour)
""")


@tensorflow_missing
@pytest.mark.timeout(240)
def test_keras_loads_the_synthetic_mnist_offline(tmp_path):
    """Keras 3 and tf-keras (scripts/bootstrap.sh installs it for the tests), in one process."""
    data = tf_support.synthetic_mnist(train=2000, test=500)
    env = {**os.environ, **tf_support.keras_mnist_env(tmp_path / "data", data),
           "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "TF_USE_LEGACY_KERAS": "1"}
    out = tmp_path / "loaded"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", LOAD, str(out)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stdout.count("LOADED ") == 2 and "LOADED tf_keras" in done.stdout, done.stdout[-3000:]
    assert "Downloading" not in done.stdout + done.stderr
    (x_train, y_train), (x_test, y_test) = data
    for flavour in ("keras3", "tf_keras"):
        with np.load(out / f"{flavour}.npz") as loaded:
            for name, want in (("x_train", x_train), ("y_train", y_train), ("x_test", x_test),
                               ("y_test", y_test)):
                assert loaded[name].dtype == np.uint8 and np.array_equal(loaded[name], want), \
                    (flavour, name)
    assert x_train.shape == (2000, 28, 28) and set(np.unique(y_train)) == set(range(10))


def test_the_environment_stays_in_the_temporary_directory(tmp_path):
    env = tf_support.keras_mnist_env(tmp_path, tf_support.synthetic_mnist(train=100, test=10), ranks=2)
    for name in ("HOME", "KERAS_HOME", tf_support.DATASETS_VARIABLE):
        assert Path(env[name]).resolve().is_relative_to(tmp_path.resolve()), (name, env[name])
    datasets = Path(env["KERAS_HOME"]) / "datasets"
    assert datasets == Path(env["HOME"]) / ".keras" / "datasets"  # Keras 3's and tf-keras's place
    assert sorted(p.name for p in datasets.iterdir()) == ["mnist-0.npz", "mnist-1.npz", "mnist.npz"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "site")
    assert (tmp_path / "site" / "sitecustomize.py").is_file()


def test_the_libsvm_file_holds_the_same_digits(tmp_path):
    path = tf_support.write_mnist_libsvm(tmp_path / "mnist.bz2", rows=50, seed=3)
    images, labels = tf_support.synthetic_digits(50, seed=3)
    lines = bz2.decompress(path.read_bytes()).decode().splitlines()
    assert len(lines) == 50
    for line, image, label in zip(lines, images.reshape(50, 784), labels):
        head, *pairs = line.split()
        assert int(head) == label
        dense = np.zeros(784)
        for pair in pairs:
            index, value = pair.split(":")
            dense[int(index) - 1] = float(value)
        assert 1 <= int(pairs[0].split(":")[0]) and np.allclose(dense, image / 255, atol=1e-3)
