"""The package's version has one source, `__version__` in
python/torch_pjrt/__init__.py: pyproject.toml takes it from there, and the
installed distribution metadata agrees with it. The build backend is
scikit-build-core over the CMake project (make test-install installs it for
real)."""

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


def _pyproject():
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def test_pyproject_takes_the_version_from_the_package():
    config = _pyproject()
    project = config["project"]
    assert "version" not in project, "pyproject.toml must not repeat the version: it is dynamic"
    assert "version" in project.get("dynamic", [])
    assert config["tool"]["scikit-build"]["metadata"]["version"] == {
        "provider": "scikit_build_core.metadata.regex", "input": "python/torch_pjrt/__init__.py"}


def test_pyproject_version_resolves_to_dunder_version():
    regex = pytest.importorskip("scikit_build_core.metadata.regex")
    resolved = regex.dynamic_metadata("version", {"input": INIT})
    assert resolved == source_version()


def test_the_build_backend_is_scikit_build_core_over_the_cmake_project():
    config = _pyproject()
    assert config["build-system"]["build-backend"] == "scikit_build_core.build"
    assert "torch" not in " ".join(config["build-system"]["requires"]), "torch must come from the user's environment"
    skbuild = config["tool"]["scikit-build"]
    assert skbuild["wheel"]["packages"] == ["python/torch_pjrt", "python/_torch_pjrt_autoload.py"]
    assert skbuild["cmake"]["define"]["TPJ_BUILD_TESTS"] == "OFF"  # a pip build needs no GoogleTest
    assert skbuild["build-dir"].startswith("build-pip/")  # persistent: reinstalls are incremental
    [editable] = [o for o in skbuild["overrides"] if o["if"] == {"state": "editable"}]
    assert editable["cmake"]["define"] == {"TPJ_PACKAGE_ONLY": "ON"}  # make build compiled _C already


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


def test_a_compiler_that_links_libstdcxx_statically_is_refused_at_configure(tmp_path):
    # Such a compiler (seen as the default CXX of a GPU machine) builds an _C
    # with its own libstdc++ next to torch's, which crashed at the first
    # number an iostream formatted: CMake refuses it before compiling.
    import shutil
    import subprocess
    import sys

    gxx = shutil.which("g++")
    if gxx is None or shutil.which("cmake") is None or shutil.which("readelf") is None:
        pytest.fail("the build needs g++, cmake and readelf (binutils)")
    wrapper = tmp_path / "g++-static"
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    configure = ["cmake", "-S", ROOT, "-DTPJ_BUILD_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-DTPJ_PYTHON_DIR={tmp_path / 'py'}"]
    env = dict(os.environ, CXX=str(wrapper))
    r = subprocess.run(configure + ["-B", str(tmp_path / "static")], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "links libstdc++ statically into shared libraries" in r.stdout + r.stderr
    env["CXX"] = gxx
    r = subprocess.run(configure + ["-B", str(tmp_path / "shared")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
