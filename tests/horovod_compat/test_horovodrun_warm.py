"""``horovodrun -np 2 python script.py`` with ranks forked from the warm fork server (the default on
one host) against the same command with every rank a new process (``HOROVOD_COMPAT_WARM_SECONDS=0``):
what the script sees, its output, exit statuses and tracebacks must be the same; the second
warm launch finds torch imported already."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import procs

PROBE = r'''
import json, os, sys
preloaded = "torch" in sys.modules
import horovod.torch as hvd
hvd.init()
facts = {
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
    "slots": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") and k != "HOROVOD_HOSTNAME"
              and not k.startswith("HOROVOD_COMPAT_")},
    "torchrun": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
    "stdin": sys.stdin.read(), "cwd_importable": os.getcwd() in sys.path,
    "rank": hvd.rank(), "size": hvd.size(), "preloaded": preloaded, "private": sorted(
        k for k in os.environ if k.startswith("DISTRIBUTOR_") and k != "DISTRIBUTOR_FAILURE_FILE"),
}
print("FACTS", json.dumps(facts), flush=True)
code = int(sys.argv[1])
if code and hvd.rank() == 1:
    if code == 99:
        def broken():
            raise ValueError("rank 1 gives up")
        broken()
    sys.exit(code)
'''


def _horovodrun(tmp_path, *command, warm=True):
    env = dict(os.environ)
    if not warm:
        env["HOROVOD_COMPAT_WARM_SECONDS"] = "0"
    return subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", "2", *command],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def _facts(done):
    rows = [json.loads(line.split("FACTS ", 1)[1]) for line in done.stdout.splitlines() if "FACTS " in line]
    return sorted(rows, key=lambda r: r["rank"])


@pytest.fixture(autouse=True)
def own_warm_servers(tmp_path_factory, monkeypatch):
    """Servers of this test's own (another test's could have learned torch already)."""
    directory = tmp_path_factory.mktemp("warm")
    directory.chmod(0o700)
    monkeypatch.setenv("HOROVOD_COMPAT_WARM_DIR", str(directory))
    yield
    procs.stop_warm_servers_in(str(directory))


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    (tmp_path / "probe_mod.py").write_text(PROBE)
    return tmp_path


def test_a_warm_rank_sees_what_a_new_python_process_sees(probe):
    plain = _horovodrun(probe, sys.executable, "sub/probe.py", "0", warm=False)
    warm = [_horovodrun(probe, sys.executable, "sub/probe.py", "0") for _ in range(2)]
    for done in (plain, *warm):
        assert done.returncode == 0, done.stderr
    expected = _facts(plain)
    assert [r["rank"] for r in expected] == [0, 1]
    for done in warm:
        got = _facts(done)
        for mine, theirs in zip(got, expected):
            assert {k: v for k, v in mine.items() if k != "preloaded"} == \
                   {k: v for k, v in theirs.items() if k != "preloaded"}
    assert expected[0]["argv"] == ["sub/probe.py", "0"] and expected[0]["path0"] == str(probe / "sub")
    assert expected[0]["private"] == []
    assert not any(r["preloaded"] for r in expected)
    # the daemon started for the first warm launch imports torch, which the script imports,
    # before it forks the ranks; the second launch finds it there
    assert all(r["preloaded"] for done in warm for r in _facts(done))


def test_python_dash_m_runs_the_module_as_python_does(probe):
    plain = _facts(_horovodrun(probe, sys.executable, "-m", "probe_mod", "0", warm=False))
    warm = _facts(_horovodrun(probe, sys.executable, "-m", "probe_mod", "0"))
    for facts in (plain, warm):
        assert [r["argv"] for r in facts] == [[str(probe / "probe_mod.py"), "0"]] * 2
    strip = lambda rows: [{k: v for k, v in r.items() if k != "preloaded"} for r in rows]  # noqa: E731
    assert strip(plain) == strip(warm)
    assert warm[0]["path0"] == str(probe) and warm[0]["cwd_importable"]


@pytest.mark.parametrize("code", [3, 99])
def test_exit_statuses_and_tracebacks_are_the_same(probe, code):
    plain = _horovodrun(probe, sys.executable, "sub/probe.py", str(code), warm=False)
    warm = _horovodrun(probe, sys.executable, "sub/probe.py", str(code))
    assert plain.returncode == warm.returncode != 0
    head = f"Rank 1 failed (exit status {1 if code == 99 else code})"
    assert head in plain.stderr and head in warm.stderr, (plain.stderr, warm.stderr)
    if code == 99:
        traceback = [line for line in plain.stderr.splitlines() if line.startswith("[1]<stderr>:")]
        assert f'File "{probe / "sub" / "probe.py"}", line' in "\n".join(traceback)
        assert traceback == [line for line in warm.stderr.splitlines()
                             if line.startswith("[1]<stderr>:")], "the same traceback, line for line"


def test_a_bad_warm_setting_is_refused_before_any_rank_starts(probe):
    env = dict(os.environ, HOROVOD_COMPAT_WARM_SECONDS="soon")
    done = subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", "2", sys.executable,
                           "sub/probe.py", "0"], cwd=probe, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "FACTS" not in done.stdout
    assert "HOROVOD_COMPAT_WARM_SECONDS='soon'" in done.stderr and "or 0" in done.stderr


SETS_THREADS = r'''
import os, sys
preloaded = "torch" in sys.modules
os.environ["OMP_NUM_THREADS"] = "1"  # read when torch's OpenMP runtime loads
import torch
print("THREADS", preloaded, torch.get_num_threads(), flush=True)
'''


def test_a_script_that_sets_variables_before_its_imports_runs_in_a_new_process(tmp_path):
    (tmp_path / "threads.py").write_text(SETS_THREADS)
    for _ in range(2):  # the second launch too: torch is never imported before the script's line
        done = _horovodrun(tmp_path, sys.executable, "threads.py")
        assert done.returncode == 0, done.stderr
        rows = [line.split("THREADS ", 1)[1] for line in done.stdout.splitlines() if "THREADS " in line]
        assert rows == ["False 1", "False 1"], done.stdout


def _threads_after_setting_them():
    import os
    import sys

    preloaded = "torch" in sys.modules
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    return preloaded, torch.get_num_threads()


def _torch_was_there():
    import sys

    there = "torch" in sys.modules
    import torch  # noqa: F401 - what the server learns

    return there


def test_horovod_run_forks_warm_ranks_unless_the_function_sets_variables():
    import horovod

    # this file imports torch (in functions): a daemon started for the first launch imports it
    # before it forks the ranks
    assert horovod.run(_torch_was_there, num_proc=2) == [True, True]
    assert horovod.run(_threads_after_setting_them, num_proc=2) == [(False, 1), (False, 1)]


@pytest.mark.parametrize("source, expected", [
    ("import tensorflow as tf\nimport horovod.tensorflow.keras as hvd\n", ("tensorflow", "torch")),
    ("from horovod import torch as hvd\n", ("torch",)),
    ("import horovod.keras as hvd\n", ("tensorflow", "torch")),
    ("import torchvision\nimport tensorflowjs\nimport numpy\n", ()),
    ("import horovod\nhorovod.run(print)\n", ()),
])
def test_the_daemon_expects_the_expensive_imports_of_the_script(tmp_path, source, expected):
    from distributor import FunctionTarget
    from distributor.rank_entry import run_as_main
    from horovod_compat.launch.job import _expected_imports
    from horovod_compat.run_rank import call_with_slot_env

    (tmp_path / "script.py").write_text(source)
    target = FunctionTarget(call_with_slot_env, (run_as_main, str(tmp_path / "script.py"), (), False))
    assert _expected_imports(target) == expected


@pytest.mark.parametrize("source, preload", [
    ("import tensorflow as tf\nimport horovod.tensorflow.keras as hvd\n", ("torch", "tensorflow")),
    ("import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\nimport tensorflow as tf\n", ("torch",)),
    ("import horovod.torch as hvd\n", ("torch",)),
])
def test_an_elastic_jobs_fork_server_imports_tensorflow_for_a_script_that_imports_it(
        tmp_path, source, preload):
    """Elastic workers and their replacements fork from the job's own fork server: it imports
    TensorFlow once for them, unless the script sets variables that TensorFlow reads at import."""
    from distributor import ScriptTarget
    from horovod_compat.launch.job import HorovodJob

    (tmp_path / "script.py").write_text(source)
    assert HorovodJob._elastic_preload(ScriptTarget(str(tmp_path / "script.py"))) == preload
