"""A rank's traceback names the user's file and line and shows the source line, however the
function travelled: by value from a test module, from a script's ``__main__``, from a module file
that no longer exists when the ranks run, or (tests/horovod_compat/test_notebook.py) from a
notebook cell. Real rank processes; the ranks run whatever cloudpickle the driver runs
(test_cloudpickle_versions.py runs this file again with the oldest one setup.cfg allows)."""
from __future__ import annotations

import linecache
import os
import subprocess
import sys
import textwrap
import types

import cloudpickle
import pytest

from distributor import RankFailedError, run_function
from distributor.payload import dumps_function, loads_target, restore_sources, source_texts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fail_on_rank_1(tag):
    import os

    import cloudpickle

    if os.environ["RANK"] == "1":
        raise ValueError(f"{tag} with cloudpickle {cloudpickle.__version__}")  # the failing line


def _line_of(text: str, path: str) -> int:
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def test_by_value_function_names_its_file_line_and_source():
    with pytest.raises(RankFailedError) as info:
        run_function(_fail_on_rank_1, "from a test module", num_processes=2,
                     output=lambda *a: None)
    err = info.value
    line = _line_of("# the failing line", __file__)
    assert f'File "{__file__}", line {line}, in _fail_on_rank_1' in err.traceback, err.traceback
    assert 'raise ValueError(f"{tag} with cloudpickle' in err.traceback
    assert "<dynamic-code>" not in err.traceback
    assert err.exc_message == f"from a test module with cloudpickle {cloudpickle.__version__}"


def _driver_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def test_function_from_a_module_file_the_ranks_cannot_read(tmp_path):
    """The driver pickles a function of a user module, then the file goes away before the ranks
    start (as on a host that has no copy): the source line still reaches the traceback, because
    it travels with the payload."""
    (tmp_path / "usercode.py").write_text(textwrap.dedent("""\
        import os


        def nested_helper(n):
            return [1 / (n - int(os.environ["RANK"])) for _ in range(1)]  # divides by zero on rank 1


        def train():
            return nested_helper(1)
        """))
    (tmp_path / "driver.py").write_text(textwrap.dedent("""\
        import os, sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import usercode
        from distributor import RankFailedError, payload, run_function

        pickle_function = payload.dumps_function


        def pickle_then_remove_the_file(*args):
            data = pickle_function(*args)
            os.remove(usercode.__file__)
            return data


        payload.dumps_function = pickle_then_remove_the_file
        try:
            run_function(usercode.train, num_processes=2, output=lambda *a: None)
        except RankFailedError as err:
            print(err.traceback)
        """))
    done = subprocess.run([sys.executable, str(tmp_path / "driver.py")], capture_output=True,
                          text=True, timeout=120, env=_driver_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    module = str(tmp_path / "usercode.py")
    assert not os.path.exists(module)
    out = done.stdout
    assert f'File "{module}", line 9, in train' in out, out
    assert "return nested_helper(1)" in out
    assert f'File "{module}", line 5, in <listcomp>' in out or \
        f'File "{module}", line 5, in nested_helper' in out, out
    assert "divides by zero on rank 1" in out and "ZeroDivisionError" in out


def test_a_module_the_caller_registered_by_value_stays_registered(tmp_path, monkeypatch):
    """The payload pickles a user module's functions by value for the call only, and leaves
    cloudpickle's registry as it found it: a module the caller registered itself (as the Spark
    host tests register their helpers, whose functions go to executors that cannot import them)
    stays registered after a call whose function comes from it (once, its next job's ranks could
    not unpickle it: "No module named 'spark_clusters'")."""
    for name in ("mine_registered", "mine_not"):
        (tmp_path / f"{name}.py").write_text("def train():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mine_not
    import mine_registered

    cloudpickle.register_pickle_by_value(mine_registered)
    try:
        for module in (mine_registered, mine_not):
            dumps_function(module.train, (), {})
        assert "mine_registered" in cloudpickle.list_registry_pickle_by_value()
        assert "mine_not" not in cloudpickle.list_registry_pickle_by_value()
    finally:
        cloudpickle.unregister_pickle_by_value(mine_registered)


def test_function_defined_in_a_scripts_main(tmp_path):
    script = tmp_path / "train_main.py"
    script.write_text(textwrap.dedent("""\
        from distributor import TorchDistributor


        class Model:
            def step(self, rank):
                if rank == 1:
                    raise RuntimeError("loss is NaN on rank 1")  # the failing line
                return 0.5


        def train():
            import os
            return Model().step(int(os.environ["RANK"]))


        if __name__ == "__main__":
            TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=_driver_env(), cwd=tmp_path)
    assert done.returncode == 1
    err = done.stderr
    assert f'File "{script}", line 7, in step' in err, err
    assert 'raise RuntimeError("loss is NaN on rank 1")  # the failing line' in err
    assert f'File "{script}", line 13, in train' in err


def _compiled_function(filename: str, source: str) -> types.FunctionType:
    namespace: dict = {"__name__": "cell"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["cell_fn"]


def test_payload_carries_the_source_of_code_that_lives_only_in_linecache():
    """What IPython does for a cell: the code's file name exists only in the driver's linecache."""
    filename = "/tmp/ipykernel_0/does-not-exist-123.py"
    source = "def cell_fn():\n    return [i for i in range(3)]\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        fn = _compiled_function(filename, source)
        data = dumps_function(fn, (), {})
    finally:
        del linecache.cache[filename]
    kind, loaded, args, kwargs = loads_target(data)
    try:
        assert kind == "function" and (args, kwargs) == ((), {})
        assert loaded() == [0, 1, 2]
        assert loaded.__code__.co_filename == filename
        nested = [c for c in loaded.__code__.co_consts if isinstance(c, types.CodeType)]
        assert nested and all(c.co_filename == filename for c in nested)
        assert linecache.getline(filename, 2) == "    return [i for i in range(3)]\n"
    finally:
        linecache.cache.pop(filename, None)


def test_source_texts_leave_out_installed_packages_this_project_and_unknown_files():
    import distributor.engine

    sources = source_texts({pytest.__file__, distributor.engine.__file__, "<string>", __file__})
    assert list(sources) == [__file__]
    assert "".join(sources[__file__]).startswith('"""A rank\'s traceback')


def test_restored_sources_win_over_the_ranks_own_copy(tmp_path):
    path = tmp_path / "changed.py"
    path.write_text("rank's copy\n")
    restore_sources({str(path): ["driver's copy\n"]})
    try:
        linecache.checkcache(str(path))
        assert linecache.getline(str(path), 1) == "driver's copy\n"
    finally:
        linecache.cache.pop(str(path), None)
