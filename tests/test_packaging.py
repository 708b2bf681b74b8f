"""What users install is what the tests ran: build the sdist and the wheel, install, run.

From a clean copy of the repository's files (those git tracks or would add,
never the virtual environment or build folders) this builds the sdist and the
wheel with the project's build backend, checks that both ship LICENSE, installs
the wheel into a fresh virtual environment and runs ``onnxgrad-sklearn --help``
and a 3-epoch fit there. Nothing is downloaded when the environment running the
tests has ``wheel`` (or setuptools >= 70.1, which builds wheels itself): the
fresh environment reuses this one's site-packages through a ``.pth`` file for
the dependencies, and the wheel is installed with ``--no-deps --no-index``.
Without ``wheel`` the wheel is built by ``pip wheel`` in an isolated build
environment, which takes setuptools and wheel from the package index (or pip's
cache). About 10 s on two cores (not marked slow).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKEND = "from setuptools import build_meta as b; import sys; print(b.{}(sys.argv[1]))"


def _run(args, cwd, timeout=300, env=None):
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


def _repository_files():
    """The files git tracks, and those it would add (not ignored), that exist."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of the repository's files")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def _clean_copy(folder: Path) -> Path:
    source = folder / "source"
    for name in _repository_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return source


def _can_build_wheels_offline() -> bool:
    if importlib.util.find_spec("wheel") is not None:
        return True
    import setuptools

    major, minor = (int(part) for part in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


def _build(source: Path, dist: Path):
    dist.mkdir()
    sdist = _run([sys.executable, "-c", BACKEND.format("build_sdist"), dist], cwd=source)
    sdist = dist / sdist.stdout.split()[-1]
    if _can_build_wheels_offline():
        wheel = _run([sys.executable, "-c", BACKEND.format("build_wheel"), dist], cwd=source)
        wheel = dist / wheel.stdout.split()[-1]
    else:
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check"]
        _run([*pip, "--wheel-dir", dist, source], cwd=source)
        (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def _fresh_environment(folder: Path) -> Path:
    """A new venv whose dependencies are this environment's site-packages."""
    venv = folder / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=folder)
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], folder)
    # plain paths, not site dirs: their .pth files (this checkout's editable
    # install among them) are not run, so the package comes from the wheel
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(site.stdout.strip(), "dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    return venv


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packaging")
    sdist, wheel = _build(_clean_copy(folder), folder / "dist")
    return folder, sdist, wheel


def test_license_in_sdist_and_wheel(built):
    _, sdist, wheel = built
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    assert f"{top}/LICENSE" in names, names
    assert f"{top}/onnxgrad_sklearn/cli.py" in names
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        licenses = [n for n in names if ".dist-info/" in n and n.endswith("/LICENSE")]
        assert licenses, names
        assert b"Copyright (c) 2026 onnxgrad_sklearn developers" in whl.read(licenses[0])
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "License-File: LICENSE" in whl.read(metadata).decode()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "onnxgrad-sklearn = onnxgrad_sklearn.cli:main" in whl.read(entry_points).decode()
    assert not any(n.startswith(("tests/", "log")) for n in names)


@pytest.mark.slow
def test_installed_wheel_runs_the_command(built):
    folder, _, wheel = built
    venv = _fresh_environment(folder)
    python, script = venv / "bin" / "python", venv / "bin" / "onnxgrad-sklearn"
    pip = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed"]
    _run([*pip, "--disable-pip-version-check", "--quiet", wheel], cwd=folder)
    work = folder / "work"
    work.mkdir()
    where = _run([python, "-c", "import onnxgrad_sklearn; print(onnxgrad_sklearn.__file__)"], work)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's copy

    help_text = _run([script, "--help"], cwd=work).stdout
    assert "fit" in help_text and "predict" in help_text and "demo" in help_text
    rows = ["a,b,y"] + [f"{i % 7},{(3 * i) % 5},{i % 7 - 0.5 * ((3 * i) % 5)}" for i in range(60)]
    (work / "small.csv").write_text("\n".join(rows) + "\n")
    fit = [script, "fit", "--data", "small.csv", "--target", "y", "--model", "linear"]
    result = _run([*fit, "--epochs", "3", "--quiet", "--out", "small.onnx"], cwd=work)
    assert "trained 3 epochs" in result.stdout
    assert (work / "small.onnx").stat().st_size > 0
