"""The package's version has one source, `__version__` in
python/torch_pjrt/__init__.py: pyproject.toml takes it from there, and the
installed distribution metadata agrees with it."""

import ast
import importlib.metadata
import os

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")
INIT = os.path.join(ROOT, "python", "torch_pjrt", "__init__.py")


def source_version() -> str:
    """`__version__` as written in __init__.py, read without importing (as setuptools does)."""
    tree = ast.parse(open(INIT).read(), INIT)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{INIT} assigns no literal __version__")


def test_pyproject_takes_the_version_from_the_package():
    with open(PYPROJECT, "rb") as f:
        config = tomllib.load(f)
    project = config["project"]
    assert "version" not in project, "pyproject.toml must not repeat the version: it is dynamic"
    assert "version" in project.get("dynamic", [])
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torch_pjrt.__version__"}


def test_pyproject_version_resolves_to_dunder_version():
    setuptools_config = pytest.importorskip("setuptools.config.pyprojecttoml")
    resolved = setuptools_config.read_configuration(PYPROJECT, expand=True)["project"]["version"]
    assert resolved == source_version()


def test_installed_metadata_matches_the_package():
    import torch_pjrt

    assert torch_pjrt.__version__ == source_version()
    try:
        installed = importlib.metadata.version("torch-pjrt")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch-pjrt is not installed as a distribution (run from the source tree)")
    assert installed == torch_pjrt.__version__, (
        f"installed metadata says {installed}, the package says {torch_pjrt.__version__}: reinstall it with "
        "`pip install --no-build-isolation --no-deps -e .` (make build does)")
