"""The documentation: the site builds with warnings as errors, its index page renders in a real
headless browser (Chromium) as it did when its baseline screenshot was taken, and the README's quick
start runs as pasted (the README's install command runs in a fresh venv in tests/test_install.py,
whose venv the rest of that file uses).

The screenshot baseline is tests/data/docs_index.png; after an intended change of the index page
(docs/index.md, or the README section it includes), write a new one with
``UPDATE_SCREENSHOTS=1 pytest tests/test_docs.py`` and look at it before committing it.
"""
from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiers import CI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "data" / "docs_index.png"
WINDOW = (1280, 900)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs tools are not installed: pip install "
                                         "'horovod-compat[docs]'")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    return done, out


def _text(page: Path) -> str:
    """A built page's text: tags dropped (highlighted code is split into spans), entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_the_site_builds_with_warnings_as_errors(site):
    done, out = site
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    # a link mkdocs cannot resolve (a folder has no page) is a warning, so --strict fails on it
    assert re.search(r"^  unrecognized_links: warn\b", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "unrecognized relative link" not in done.stderr, done.stderr[-3000:]
    pages = {p.parent.name for p in out.glob("*/index.html")}
    assert {"horovod", "torch_distributor", "timeline", "elastic", "spark_placement",
            "spark_estimators", "architecture", "tensorflow"} <= pages, sorted(pages)
    assert (out / "migration_guide" / "index.html").is_file()
    # the API reference is rendered from the docstrings
    api = _text(out / "api" / "horovod_torch" / "index.html")
    assert "DistributedOptimizer" in api and "named_parameters" in api
    assert "num_processes" in _text(out / "api" / "torch_distributor" / "index.html")
    assert "driver_log_verbosity" in _text(out / "api" / "horovod_runner" / "index.html")
    # the index page carries the README's install and quick start section
    index = _text(out / "index.html")
    assert "pip install" in index and "HorovodRunner(np=-2).run(train)" in index


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = ("Chromium is not installed (scripts/bootstrap.sh installs it as root on Debian: "
                   "apt-get install chromium)")
        if CI:
            pytest.fail(message + "; CI must run the screenshot test")
        pytest.skip(message)
    return found


def test_the_index_page_renders_as_its_baseline_screenshot(site, tmp_path):
    import numpy as np
    from matplotlib import image

    done, out = site
    assert done.returncode == 0, done.stderr[-3000:]
    shot = tmp_path / "index.png"
    run = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                          f"--screenshot={shot}", (out / "index.html").as_uri()],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HOME=str(tmp_path)))
    assert run.returncode == 0 and shot.is_file(), run.stderr[-3000:]
    pixels = image.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    # the theme's header bar (its stylesheet loaded) and dark text on white in the content column
    header = pixels[10:40, 400:900].reshape(-1, 3).mean(axis=0)
    assert header[2] > header[0] + 0.2, f"no coloured header bar: {header}"
    content = pixels[150:800, 300:980]
    assert (content.mean(axis=2) < 0.3).mean() > 0.01, "no text in the content column"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        BASELINE.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, BASELINE)
        pytest.skip(f"wrote a new baseline {BASELINE}: look at it before committing it")
    baseline = image.imread(str(BASELINE))[..., :3]
    assert baseline.shape == pixels.shape
    differ = (np.abs(baseline - pixels).max(axis=2) > 0.25).mean()
    assert differ < 0.02, (f"{differ:.1%} of the index page's pixels differ from {BASELINE}; "
                           f"the screenshot is {shot}")


def _quick_start_blocks(language: str):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("## Documentation")]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


@pytest.mark.timeout(300)
def test_the_readme_quick_start_python_blocks_run_as_pasted(tmp_path):
    _train_py, *blocks = _quick_start_blocks("python")  # train.py: the commands' test runs it
    assert len(blocks) == 2, blocks
    for i, block in enumerate(blocks):
        script = tmp_path / f"quick_start_{i}.py"
        script.write_text(block + "\nprint('QUICK START DONE')\n")
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0 and "QUICK START DONE" in done.stdout, \
            block + done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.timeout(300)
def test_the_readme_quick_start_commands_run_as_pasted(tmp_path):
    """The README's train.py under the commands it shows: horovodrun, the rewriter, torchrun."""
    horovodrun_block, migrate_block = _quick_start_blocks("bash")
    train_py = _quick_start_blocks("python")[0]
    assert "import horovod.torch as hvd" in train_py, train_py
    (tmp_path / "train.py").write_text(train_py)
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for block in (horovodrun_block, migrate_block):
        for line in block.splitlines():
            command = line.split("#")[0].strip()
            done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True,
                                  text=True, timeout=240, env=env)
            if command.startswith("horovod-compat-migrate"):
                # --diff prints the change and exits 0 when the result is native
                assert done.returncode == 0 and "DistributedDataParallel" in done.stdout, \
                    done.stdout[-2000:] + done.stderr[-2000:]
                subprocess.run(["horovod-compat-migrate", "train.py"], cwd=tmp_path, env=env,
                               check=True, capture_output=True, timeout=120)
            else:
                if done.returncode != 0 and command.startswith("torchrun"):
                    # torch 2.13's gloo teardown abort after the work is done, in about 1 run of
                    # 10 under plain torchrun (migration_guide/troubleshooting.md): only that
                    assert "terminate called without an active exception" in done.stderr \
                        and "SIGABRT" in done.stderr, command + done.stderr[-3000:]
                else:
                    assert done.returncode == 0, command + done.stdout[-2000:] + done.stderr[-3000:]
                assert re.search(r"rank 0 of 2: loss \d", done.stdout) \
                    and re.search(r"rank 1 of 2: loss \d", done.stdout), done.stdout


def test_the_readme_figures_give_one_figure_a_row_with_a_command_that_exists():
    """One number a cell, no ranges or history (those are in docs/benchmarks.md), and each row's
    command names a script of benchmarks/."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Figures"):text.index("Also in `benchmarks/`")]
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| what |", "| --- |"))]
    assert len(rows) >= 10, section
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 3, row
        assert re.fullmatch(r"\d+(\.\d+)?(x| s)?", cells[1]), row
        script = re.match(r"`python (benchmarks/\w+\.py)\b", cells[2])
        assert script and (ROOT / script.group(1)).is_file(), row
    assert (ROOT / "docs" / "benchmarks.md").is_file()
