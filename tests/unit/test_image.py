"""The container image builds: compose/Dockerfile's copy set is enough to install raftbroker.

There is no Docker engine here, so the build is replayed: the Dockerfile's `COPY` lines from the
repository into an empty directory (as its build context would be copied to `/src`), then its
`pip install .` into a fresh virtual environment, then the entrypoint's `--version` and an import
of every package pyproject.toml ships. A package added to pyproject.toml without a `COPY` line
(the image once failed on `pipeline`) fails here.

The install is offline and goes nowhere but the disk (tests send nothing off loopback): the fresh
environment finds the build backend and the dependencies through a path file naming this
interpreter's site-packages, and pip runs with `--no-index --no-deps --no-build-isolation`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "compose" / "Dockerfile"
INSTALL_TIMEOUT_S = 240
# The fresh environment sees only what it installed and the path file below: not a PYTHONPATH
# that points at this checkout.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def copy_lines(dockerfile: str) -> list[tuple[list[str], str]]:
    """Each `COPY src... dest` of the Dockerfile (no flags are used there)."""
    found = []
    for line in dockerfile.splitlines():
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line, comments=True)
        if words:
            assert not any(w.startswith("--") for w in words), f"a COPY flag: {line}"
            found.append((words[1:-1], words[-1]))
    return found


def replay_copies(dockerfile: str, context: Path, workdir: Path) -> None:
    """What the Dockerfile's COPY lines put in its WORKDIR (relative destinations only)."""
    for sources, dest in copy_lines(dockerfile):
        target = workdir / dest
        for source in sources:
            path = context / source
            assert path.exists(), f"COPY {source}: not in the build context"
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


def shipped_top_level() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted({name.split(".")[0] for name in config["tool"]["setuptools"]["packages"]})


def install_copy_set(dockerfile: str, tmp_path: Path) -> tuple[Path, Path, str]:
    """Replay the copies, then `pip install` them into a fresh environment: the environment,
    its site-packages, and pip's error output ("" when the install worked)."""
    src = tmp_path / "src"
    src.mkdir()
    replay_copies(dockerfile, ROOT, src)
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            env=CLEAN_ENV,
        ).stdout.strip()
    )
    # Our dependencies and pip, from the interpreter running the tests (a plain path line: the
    # editable install of this checkout there is not activated, so the copy is what imports).
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install: list[str | Path] = [python, "-m", "pip", "install", "--no-index", "--no-deps"]
    install.append("--no-build-isolation")
    result = subprocess.run(
        [*install, "--quiet", str(src)],
        check=False,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=tmp_path,
        env=CLEAN_ENV,
    )
    return env_dir, site, "" if result.returncode == 0 else result.stderr[-3000:] or "failed"


def test_the_dockerfile_copy_set_installs_and_runs(tmp_path: Path) -> None:
    env_dir, site, error = install_copy_set(DOCKERFILE.read_text(), tmp_path)
    assert error == "", f"pip install of the copy set failed:\n{error}"
    version = subprocess.run(
        [env_dir / "bin" / "raftbroker", "--version"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=CLEAN_ENV,
    )
    assert version.returncode == 0, version.stderr[-3000:]
    assert version.stdout.startswith("raftbroker "), version.stdout
    packages = shipped_top_level()
    imported = subprocess.run(
        [
            env_dir / "bin" / "python",
            "-c",
            f"import {', '.join(packages)}; print({packages[0]}.__file__)",
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=CLEAN_ENV,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.startswith(str(site)), f"imported from elsewhere: {imported.stdout}"


def test_the_replay_fails_without_a_copy_line(tmp_path: Path) -> None:
    dockerfile = DOCKERFILE.read_text().replace("COPY pipeline ./pipeline\n", "")
    _, _, error = install_copy_set(dockerfile, tmp_path)
    assert "pipeline" in error, error


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("COPY a b ./", (["a", "b"], "./")),
        ("copy cluster ./cluster  # why", (["cluster"], "./cluster")),
    ],
)
def test_copy_lines_are_read(line: str, expected: tuple[list[str], str]) -> None:
    assert copy_lines(line) == [expected]
