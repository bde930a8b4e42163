"""setup.py's errors before anything compiles (scripts/test, step 6, runs the install itself:
a clean clone, a fresh venv's old setuptools, the CUDA toolkit hidden)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def setup_py(**env):
    """`python setup.py --version` (setup.py checks everything on import) with `env` set."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                          env={**environ, "PAGESTASH_CUDA": "0", **env})


@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
def test_cuda_home_pointing_nowhere_is_named(var, tmp_path):
    """A CUDA_HOME (or CUDA_PATH) that is no CUDA toolkit stops the build, naming the variable
    and what is wrong with it, not packages to install."""
    for home, what in ((tmp_path / "missing", "does not exist"), (tmp_path, "has no include/cuda_runtime_api.h")):
        result = setup_py(**{var: str(home)})
        assert result.returncode != 0
        assert f"pagestash: {var}={home} {what}: point {var} at a CUDA toolkit" in result.stderr, result.stderr
        assert "pip install" not in result.stderr
