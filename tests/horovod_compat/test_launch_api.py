"""horovod.run on this host (real rank processes) and the frameworks we do not provide."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import pytest

import horovod
from distributor import RankFailedError


def where(tag, scale=1):
    import os

    import horovod.torch as hvd

    hvd.init()
    print(f"hello from {hvd.rank()}")
    return {"rank": hvd.rank(), "size": hvd.size(), "local": (hvd.local_rank(), hvd.local_size()),
            "tag": tag * scale, "slot_rank": os.environ.get("HOROVOD_RANK"),
            "marker": os.environ.get("LAUNCH_API_MARKER")}


def test_results_in_rank_order_with_args_kwargs_and_the_callers_env(monkeypatch, capsys):
    monkeypatch.setenv("LAUNCH_API_MARKER", "from-the-driver")
    results = horovod.run(where, args=("ab",), kwargs={"scale": 2}, num_proc=3)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert {r["size"] for r in results} == {3}
    assert [r["local"] for r in results] == [(0, 3), (1, 3), (2, 3)]
    assert {r["tag"] for r in results} == {"abab"}
    assert [r["slot_rank"] for r in results] == ["0", "1", "2"]  # gloo mode: Horovod's variables
    assert {r["marker"] for r in results} == {"from-the-driver"}
    out = capsys.readouterr().out
    assert all(f"[{r}]<stdout>:hello from {r}" in out for r in range(3))


def test_use_mpi_and_the_deprecated_np_alias():
    with pytest.warns(DeprecationWarning, match="np is deprecated"):
        results = horovod.run(where, args=("x",), np=2, use_mpi=True)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["slot_rank"] for r in results] == [None, None]  # as Horovod's MPI launcher


def fails_on_rank_1():
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("no such column on rank 1")
    hvd.barrier()


def test_a_failing_rank_raises_on_the_caller_with_its_traceback():
    with pytest.raises(RankFailedError) as info:
        horovod.run(fails_on_rank_1, num_proc=2)
    error = info.value
    assert isinstance(error, RuntimeError)
    assert error.rank == 1 and error.exc_type == "KeyError"
    assert "no such column on rank 1" in str(error)
    assert "fails_on_rank_1" in error.traceback and 'raise KeyError("no such column' in error.traceback
    assert f'File "{__file__}", line 53, in fails_on_rank_1' in error.traceback


def test_hosts_and_hostfile_on_this_host_and_output_files(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine twice over\nlocalhost slots=1\n127.0.0.1 slots=2\n")
    out = tmp_path / "out"
    results = horovod.run(where, args=("h",), num_proc=3, hostfile=str(hostfile),
                          output_filename=str(out))
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert sorted(os.listdir(out)) == ["rank.0", "rank.1", "rank.2"]
    assert (out / "rank.2" / "stdout").read_text() == "hello from 2\n"
    assert (out / "rank.0" / "stderr").exists()
    results = horovod.run(where, args=("h",), num_proc=2, hosts="localhost:1,127.0.0.1:1")
    assert [r["rank"] for r in results] == [0, 1]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_proc": 3, "hosts": "localhost:2"}, "offer only 2 slot"),
    ({"num_proc": 2, "hosts": "localhost:2", "hostfile": "h"}, "hosts and hostfile"),
    ({"num_proc": 2, "use_gloo": True, "use_mpi": True}, "use_gloo and use_mpi"),
    ({"num_proc": 2, "hosts": "localhost:two"}, "bad host entry"),
    ({"num_proc": 0}, "positive int"),
    ({"num_proc": 2, "network_interfaces": ["no-such-nic0"]}, "do not exist on this host"),
    ({"num_proc": 2, "min_num_proc": 3, "max_num_proc": 2}, "larger than max_num_proc"),
    ({"num_proc": 2, "start_timeout": -1}, "positive number of seconds"),
    ({"num_proc": 2, "executable": "/no/such/python"}, "not an executable"),
])
def test_bad_arguments_fail_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        horovod.run(where, args=("x",), **kwargs)


def test_elastic_arguments_are_validated_before_anything_starts(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    with pytest.raises(ValueError, match="not executable"):
        horovod.run(where, args=("x",), num_proc=2, host_discovery_script=str(script))
    script.chmod(0o755)
    with pytest.raises(ValueError, match="not both"):
        horovod.run(where, args=("x",), num_proc=2, hosts="localhost:2",
                    host_discovery_script=str(script))
    with warnings.catch_warnings(), pytest.raises(ValueError, match="gloo mode"):
        warnings.simplefilter("ignore", DeprecationWarning)
        horovod.run(where, args=("x",), num_proc=2, min_np=1, max_np=2, use_mpi=True)


def test_spark_run_without_a_spark_context_says_so():
    import horovod.spark

    with pytest.raises(ValueError, match="could not find an active SparkContext"):
        horovod.spark.run(where, args=("x",), num_proc=2)


@pytest.mark.parametrize("name", ["horovod.mxnet"])
def test_frameworks_we_do_not_provide_say_where_to_go(name):
    with pytest.raises(ModuleNotFoundError) as info:
        importlib.import_module(name)
    message = str(info.value)
    assert name.startswith(info.value.name)  # a missing parent package fails first
    assert "horovod.torch" in message and "horovod.spark.run" in message


@pytest.mark.parametrize("package, module, extra", [("tensorflow", "horovod.tensorflow", "tensorflow"),
                                                    ("ray", "horovod.ray", "ray")])
def test_a_binding_without_its_package_names_the_install_line(package, module, extra):
    """In an environment without TensorFlow (Ray), ``import horovod.tensorflow`` (``horovod.ray``)
    says what to install (checked in a fresh interpreter where importlib cannot find it)."""
    probe = ("import importlib.util as u; real = u.find_spec; "
             f"u.find_spec = lambda n, *a: None if n == {package!r} else real(n, *a); "
             f"import {module}")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode != 0
    assert f"pip install 'horovod-compat[{extra}]'" in done.stderr, done.stderr[-2000:]


def test_horovod_runner_module_and_a_fresh_interpreter():
    from horovod.runner import run

    assert run is horovod.run
    probe = ("import horovod, horovod.spark, inspect; "
             "print(sorted(n for n in ('pyspark', 'torch') if n in __import__('sys').modules)); "
             "print(list(inspect.signature(horovod.run).parameters)[-3:])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", "['np', 'min_np', 'max_np']"]
