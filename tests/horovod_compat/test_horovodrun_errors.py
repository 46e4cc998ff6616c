"""horovodrun's errors for a wrong command, Python or host list: one line ``horovodrun: <what is
wrong and how to fix it>`` on stderr, exit status 2, no traceback, and (for everything checkable on
the driver) no rank started.  Each test runs the real ``horovodrun`` console script of this venv
in a folder whose ``train.py`` would leave a marker file if any rank ran it."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

BIN = os.path.dirname(sys.executable)
HOROVODRUN = os.path.join(BIN, "horovodrun")
with open(HOROVODRUN) as _script:
    #: The Python of the console script (its #! line): what horovodrun names as its own.
    HOROVODRUN_PYTHON = _script.readline()[2:].strip()

TRAIN = textwrap.dedent("""
    import horovod.torch as hvd
    open("ran", "w").close()
""")


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)  # not executable, as a new user's script is
    return tmp_path


def horovodrun(workdir, *argv, first_on_path=BIN):
    """horovodrun ARGV in `workdir`, with `first_on_path` (default: this venv) first on PATH."""
    env = dict(os.environ, PATH=os.pathsep.join([first_on_path, os.environ.get("PATH", "")]))
    return subprocess.run([HOROVODRUN, *argv], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=120)


def assert_usage_error(done, message, workdir):
    assert (done.returncode, done.stderr, done.stdout) == (2, f"horovodrun: {message}\n", "")
    assert not (workdir / "ran").exists(), "a rank started"


def make_executable(path):
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# ---- the command --------------------------------------------------------------------------------
def test_a_script_without_python_or_execute_permission(workdir):
    done = horovodrun(workdir, "-np", "2", "train.py")
    assert_usage_error(done, "train.py is not an executable command (it is a file without execute "
                             "permission); to run a Python script, use: horovodrun -np 2 python "
                             "train.py", workdir)


def test_a_script_path_without_execute_permission(workdir):
    done = horovodrun(workdir, "-np", "2", "./train.py", "--epochs", "3")
    assert_usage_error(done, "./train.py is not an executable command (it is a file without "
                             "execute permission); to run a Python script, use: horovodrun -np 2 "
                             "python ./train.py --epochs 3", workdir)


def test_a_misspelt_script_suggests_the_close_file(workdir):
    done = horovodrun(workdir, "-np", "2", "trian.py")
    assert_usage_error(done, "command 'trian.py' not found on PATH (nor a file in this directory); "
                             "did you mean: horovodrun -np 2 python train.py", workdir)


def test_a_misspelt_python_suggests_python(workdir):
    done = horovodrun(workdir, "-np", "2", "pyton", "train.py")
    assert_usage_error(done, "command 'pyton' not found on PATH (nor a file in this directory); "
                             "did you mean: horovodrun -np 2 python train.py", workdir)


def test_a_missing_path_without_a_close_match(workdir):
    done = horovodrun(workdir, "-np", "2", "./nothing-like-it")
    assert_usage_error(done, "command './nothing-like-it' not found (no such file); check the "
                             "spelling, or give the command's path", workdir)


def test_a_directory_as_the_command(workdir):
    (workdir / "src").mkdir()
    done = horovodrun(workdir, "-np", "2", "src")
    assert_usage_error(done, "src is a directory, not an executable command; give the program to "
                             "run, e.g. horovodrun -np 2 python src/SCRIPT.py", workdir)


def test_an_executable_here_is_not_on_path(workdir):
    script = workdir / "go.sh"
    script.write_text("#!/bin/sh\ntouch ran\n")
    make_executable(script)
    done = horovodrun(workdir, "-np", "2", "go.sh")
    assert_usage_error(done, "go.sh is not on PATH (it is a file in this directory); use: "
                             "horovodrun -np 2 ./go.sh", workdir)


def test_an_executable_text_file_without_a_shebang(workdir):
    make_executable(workdir / "train.py")
    done = horovodrun(workdir, "-np", "2", "./train.py")
    assert_usage_error(done, "./train.py has no '#!' line naming its interpreter, so it cannot run "
                             "as a command; to run a Python script, use: horovodrun -np 2 python "
                             "./train.py", workdir)


def test_a_rank_that_cannot_exec_prints_one_line_and_127():
    """On another host the driver cannot check: the rank says it in one line, exit 127 (as sh)."""
    done = subprocess.run([sys.executable, "-m", "horovod_compat.run_rank", "./nothing-like-it"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 127
    assert done.stderr.endswith(": command './nothing-like-it' not found (no such file); check "
                                "the spelling, or give the command's path\n")
    assert done.stderr.startswith("horovodrun: on ") and done.stderr.count("\n") == 1


# ---- the Python that runs it ------------------------------------------------------------------
@pytest.fixture
def bare_python(tmp_path):
    """A folder whose `python` is a virtual environment without this project or torch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
                   check=True, timeout=120)
    return str(tmp_path / "bare" / "bin")


def test_a_python_without_horovod_for_a_horovod_script(workdir, bare_python):
    done = horovodrun(workdir, "-np", "2", "python", "train.py", first_on_path=bare_python)
    assert_usage_error(
        done, f"{bare_python}/python cannot import horovod, horovod_compat, torch (the Python of "
              f"this horovodrun is {HOROVODRUN_PYTHON}); run: horovodrun -np 2 {HOROVODRUN_PYTHON} "
              f"train.py, or activate that virtual environment", workdir)


def test_a_python_without_horovod_for_code_that_needs_none_is_a_warning(workdir, bare_python):
    done = horovodrun(workdir, "-np", "2", "python", "-c", "print('plain')",
                      first_on_path=bare_python)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"horovodrun: warning: {bare_python}/python cannot import horovod, horovod_compat, torch "
        f"(the Python of this horovodrun is {HOROVODRUN_PYTHON}); if the command needs them, run: "
        f"horovodrun -np 2 {HOROVODRUN_PYTHON} -c 'print('\"'\"'plain'\"'\"')', or activate that "
        f"virtual environment")
    assert done.stdout.count("plain") == 2, done.stdout  # both ranks ran


# ---- hosts --------------------------------------------------------------------------------------
HOSTS_SYNTAX = "host:slots entries joined by commas, e.g. -H host1:2,host2:2"
HOSTFILE_SYNTAX = "one 'hostname slots=N' line per host, e.g. 'host1 slots=2'"


def test_a_slot_count_that_is_not_a_number(workdir):
    done = horovodrun(workdir, "-np", "2", "-H", "localhost:two", "python", "train.py")
    assert_usage_error(done, "bad host entry 'localhost:two': the slot count 'two' is not a whole "
                             f"number; write {HOSTS_SYNTAX}", workdir)


def test_a_trailing_comma_in_the_host_list(workdir):
    done = horovodrun(workdir, "-np", "2", "-H", "localhost:2,", "python", "train.py")
    assert_usage_error(done, "bad host entry '' in -H 'localhost:2,': an empty entry (a stray "
                             f"comma, or a space after a comma); write {HOSTS_SYNTAX} (no spaces)",
                       workdir)


def test_zero_slots(workdir):
    done = horovodrun(workdir, "-np", "2", "-H", "localhost:0", "python", "train.py")
    assert_usage_error(done, f"bad host entry 'localhost:0': 0 slots; give at least 1 "
                             f"({HOSTS_SYNTAX})", workdir)


def test_a_slot_count_after_a_space(workdir):
    done = horovodrun(workdir, "-np", "2", "-H", "localhost", "2", "python", "train.py")
    assert_usage_error(done, "-H localhost is followed by '2', which looks like a slot count; "
                             f"write -H localhost:2 ({HOSTS_SYNTAX}, then the command)", workdir)


def test_more_processes_than_slots(workdir):
    done = horovodrun(workdir, "-np", "3", "-H", "localhost:2", "python", "train.py")
    assert_usage_error(done, "3 processes were requested but the hosts (localhost:2) offer only 2 "
                             "slot(s); lower -np to 2 or give the hosts more slots, e.g. "
                             "-H localhost:3", workdir)


def test_a_hostfile_that_does_not_exist(workdir):
    done = horovodrun(workdir, "-np", "2", "-hostfile", "hosts.txt", "python", "train.py")
    assert_usage_error(done, "cannot read the host file 'hosts.txt': No such file or directory; "
                             f"give a file with {HOSTFILE_SYNTAX}", workdir)


def test_a_hostfile_slot_count_that_is_not_a_number(workdir):
    (workdir / "hosts.txt").write_text("# workers\nlocalhost slots=x\n")
    done = horovodrun(workdir, "-np", "2", "-hostfile", "hosts.txt", "python", "train.py")
    assert_usage_error(done, "hosts.txt:2: 'localhost slots=x': the slot count 'x' is not a whole "
                             f"number; write {HOSTFILE_SYNTAX}", workdir)


def test_a_hostfile_in_the_h_notation(workdir):
    (workdir / "hosts.txt").write_text("localhost:2\n")
    done = horovodrun(workdir, "-np", "2", "-hostfile", "hosts.txt", "python", "train.py")
    assert_usage_error(done, "hosts.txt:1: 'localhost:2' is not a host line; write it as "
                             "'localhost slots=2' (host:slots is -H's notation)", workdir)


def test_argparse_errors_are_one_line_too(workdir):
    done = horovodrun(workdir, "-np", "two", "python", "train.py")
    assert_usage_error(done, "argument -np/--num-proc: invalid int value: 'two' (horovodrun --help "
                             "lists the options)", workdir)
