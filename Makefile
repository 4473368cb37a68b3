# torch-pjrt: every target works on a fresh machine. `make demo` and
# `make test` install what is missing (a venv in .venv, Python packages,
# GoogleTest from Debian), build, then run.

PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
VPY           := $(abspath $(VENV))/bin/python
ROOT          := $(abspath .)
export PATH   := $(abspath $(VENV))/bin:$(PATH)
# Another venv (another torch: `make test VENV=/work/venv215 TORCH_VERSION=2.15.0`)
# builds in a directory of its own, build-<venv name>, and its _C goes into
# PKG_ROOT=$(BUILD)/python/torch_pjrt next to links to the package's .py files
# (as make test-asan does), so that builds for different torch versions never
# replace each other's python/torch_pjrt/_C*.so. Its Python runs with
# PYTHONPATH=$(PKG_ROOT). The default venv keeps build/ and the source tree.
ifeq ($(abspath $(VENV)),$(ROOT)/.venv)
BUILD         ?= build
PKG_ROOT      :=
else
BUILD         ?= build-$(notdir $(abspath $(VENV)))
PKG_ROOT      := $(ROOT)/$(BUILD)/python
endif
PYENV         := $(if $(PKG_ROOT),PYTHONPATH=$(PKG_ROOT))
# The editable install's import hook maps the package to the files it was
# given: for another venv, the links in PKG_ROOT (else it would load the
# source tree's _C, built for another torch).
EDITABLE_ARGS := $(if $(PKG_ROOT),-C "wheel.packages=$(BUILD)/python/torch_pjrt;$(BUILD)/python/_torch_pjrt_autoload.py")

.PHONY: help deps system-deps build test test-cpp test-python test-asan demo bench soak models conformance conformance-special conformance-out clean test-install \
  plugin-venv test-plugin test-plugins bench-plugin bench-plugins

help:
	@echo "make demo       set up, build, run the demo on the default PJRT plugin (CPU)"
	@echo "make test       set up, build, run the C++ (CTest) and Python (pytest) tests"
	@echo "                (pytest in PYTEST_SHARDS=2 parallel processes; PYTEST_SHARDS=1: one)"
	@echo "make test VENV=<venv> TORCH_VERSION=<version>  the same against another torch (README, compatibility):"
	@echo "                a fresh venv gets torch==<version>; the build goes to build-<venv name>"
	@echo "make test-asan  C++ tests and the device/views/ops/faults Python tests under ASan+UBSan"
	@echo "                (own build in $(BUILD)-asan; ~12 min on 2 cores from cold, ~6.5 with ccache; not in make test)"
	@echo "make test-install  pip-install the checkout (or its sdist: INSTALL_FROM=sdist) into a fresh venv in"
	@echo "                $(BUILD)-install, reusing torch $(TORCH_VERSION), and run a program from outside the tree"
	@echo "                (measured 2m55s on 2 cores, cold ccache; not in make test)"
	@echo "make bench      step time vs eager PyTorch and torch.compile; writes bench/results.json and .png"
	@echo "                (BENCH_ARGS=--quick: small models only; installs matplotlib when missing)"
	@echo "make soak       20000 AdamW steps: no compiles after warm-up, host RSS growth < 2% (not in CI)"
	@echo "make models     every model-zoo family (HF transformers, vision) in every mode vs CPU (make test runs a subset)"
	@echo "make conformance  PyTorch's OpInfo samples on pjrt vs CPU; writes conformance.json"
	@echo "make conformance-special  the same with NaN, +-inf, -0.0 and empty inputs; writes conformance-special.json"
	@echo "make conformance-out  the pass list's float32 entries through their out= forms and in-place variants;"
	@echo "                writes conformance-out.json"
	@echo "make test-plugin PLUGIN=<pip spec>  make test's suites against that CPU plugin package, installed"
	@echo "                into $(PLUGIN_VENV) (e.g. PLUGIN=lammps-jax-pjrt-cpu==0.11.2); ~25 min on 2 cores"
	@echo "make test-plugins  test-plugin for each of: $(CPU_PLUGINS)"
	@echo "make bench-plugins  make bench (without inductor) against each of them, one after another;"
	@echo "                writes bench/plugins/<package>.json"
	@echo "make clean      remove build directories (keeps .venv)"

$(VPY):
	$(PYTHON) -m venv $(VENV)

# torch is installed only when missing: we build against whatever torch 2.x
# is there. An unpinned `pip install torch` would pull a multi-GB CUDA build.
# The requirements are installed with the venv's torch pinned, so that pip
# never replaces it (a pip configuration that caps torch below it makes pip
# fail instead: lift the cap for that one command, PIP_CONSTRAINT=/dev/null).
$(VENV)/.deps-stamp: requirements.txt | $(VPY)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install "torch==$(TORCH_VERSION)"
	$(VPY) -m pip install -r requirements.txt \
	  "torch==$$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(VPY) -c 'import torch; print(torch.__version__.split("+")[0])')"
	touch $@

deps: $(VENV)/.deps-stamp

# GoogleTest from Debian; ccache when available (faster rebuilds, optional).
system-deps:
	@if [ ! -f /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null; then \
	  if command -v apt-get >/dev/null; then \
	    SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libgtest-dev ccache >/dev/null || \
	      $$SUDO apt-get install -y -qq libgtest-dev >/dev/null; \
	  fi; \
	fi
	@test -f /usr/include/gtest/gtest.h || { echo "GoogleTest headers missing: install libgtest-dev"; exit 1; }

SITE = $(shell $(VPY) -c "import site; print(site.getsitepackages()[0])")

$(BUILD)/build.ninja: CMakeLists.txt tests/cpp/CMakeLists.txt | deps system-deps
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(VPY) \
	  $(if $(PKG_ROOT),-DTPJ_PYTHON_DIR=$(PKG_ROOT)/torch_pjrt) -DTPJ_TEST_SEARCH_PATH=$(SITE) \
	  -DTPJ_REFERENCE_HEADER=$(SITE)/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h

# The package is installed editable (scikit-build-core, pyproject.toml) over
# this build: _C is written into python/torch_pjrt by the CMake build above,
# and the editable install compiles nothing (TPJ_PACKAGE_ONLY); it registers
# the package, its entry points and metadata, once per version.
build: deps system-deps $(BUILD)/build.ninja
	cmake --build $(BUILD)
	@if [ -n "$(PKG_ROOT)" ]; then \
	  find $(PKG_ROOT) -type l -delete && ln -s $(ROOT)/python/_torch_pjrt_autoload.py $(PKG_ROOT)/ && \
	  for f in python/torch_pjrt/*.py; do \
	    case $$f in */_build_info.py) ;; *) ln -s $(ROOT)/$$f $(PKG_ROOT)/torch_pjrt/ ;; esac; \
	  done; \
	fi
	@$(PYENV) $(VPY) -c "import importlib.metadata as m, torch_pjrt as t; assert m.version('torch-pjrt') == t.__version__; \
	  assert t.__file__.startswith('$(or $(PKG_ROOT),$(ROOT)/python)/'), t.__file__" \
	  2>/dev/null || $(VPY) -m pip install -q --no-build-isolation --no-deps -e . $(EDITABLE_ARGS)
	@$(PYENV) $(VPY) -c "import torch, torch_pjrt._C as c; print('make build: torch', torch.__version__, '->', c.__file__)"

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

# pytest in PYTEST_SHARDS parallel processes (tests/run_pytest.py; 1: one pytest).
PYTEST_SHARDS ?= 2
test-python: build
	$(PYENV) $(VPY) tests/run_pytest.py --shards $(PYTEST_SHARDS) --log-dir $(BUILD) -q --durations=15 tests/python

test: test-cpp test-python

# make test-asan: the C++ tests and a subset of the Python tests under
# AddressSanitizer and UndefinedBehaviorSanitizer (TPJ_SANITIZE), in a build
# of its own. Its _C is written to $(SAN)/python/torch_pjrt, next to links to
# the package's .py files, so the normal python/torch_pjrt/_C*.so is never
# replaced. Timings are in README.md (build details). Not part of `make test`.
SAN        := $(BUILD)-asan
SAN_PKG    := $(SAN)/python/torch_pjrt
SAN_LOGS   := $(SAN)/sanitizer-logs
# Python: the tests of the device, views and in-place ops, the lowerings and
# the failure paths. Their subprocesses (fresh interpreters, fork, spawn)
# inherit the environment below and run instrumented too. The whole suite
# also passes under the sanitizers, but takes 10-17 minutes on 2 cores. (Two
# tests of test_import_safety used to fail there: their rebuild hint names
# `make -C <checkout>`, which the package now finds through its links to the
# checkout's files; not rerun under the sanitizers since.)
SAN_PYTESTS := tests/python/test_device.py tests/python/test_views_inplace.py \
  tests/python/test_ops.py tests/python/test_faults.py
# Runtime options of both runs, each for a reason:
#  detect_stack_use_after_return  a pointer to a returned frame's local is caught.
#  check_initialization_order, strict_init_order  a static initializer that reads
#    another file's global before it is initialized (our registrations are statics).
#  print_stacktrace  UBSan says where, not only what.
SAN_ASAN   := detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
SAN_UBSAN  := print_stacktrace=1
# C++ tests: detect_leaks=1 with tests/cpp/lsan.supp (the plugin's static
# allocations); halt_on_error=1 makes a UBSan report fail its test, which
# ctest then prints.
# Python tests:
#  LD_PRELOAD libasan  the ASan runtime must be the first library of the process,
#    and python is not linked against it. libstdc++ is preloaded with it: python
#    does not link libstdc++ either, and ASan intercepts __cxa_throw only when
#    libstdc++ is loaded before it (otherwise the first C++ throw aborts with
#    "CHECK failed: real___cxa_throw"). libubsan needs no preload: _C pulls it in.
#  detect_leaks=0  CPython and torch are not instrumented and keep interned
#    objects, caches and registries until exit: LeakSanitizer would report
#    theirs. Our leaks are the C++ tests' job.
#  allocator_may_return_null=1  test_faults allocates 512 GiB to make the plugin
#    run out of memory; ASan would abort the process there, where glibc's malloc
#    returns NULL and the plugin reports RESOURCE_EXHAUSTED.
#  halt_on_error=1  a UBSan report ends the process, as an ASan report does, so
#    that it fails the test (or the subprocess a test runs) it happened in.
#    --capture=sys lets the reports of the pytest process itself reach the
#    terminal. (UBSan's log_path would be nicer, but UBSan loaded with _C,
#    after python started, ignores it: measured with GCC 12.)
#  log_path (ASan only)  ASan reports are also written to files, listed after
#    the run, which fails if there is any: a report from a subprocess whose
#    failure a test expects is not lost in the test's captured output.
#  A check that _C was loaded from $(SAN_PKG) first: a package found elsewhere
#    would run the tests uninstrumented and pass.
SAN_PRELOAD = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libstdc++.so)
SAN_PYENV   = PYTHONPATH=$(ROOT)/$(SAN)/python LD_PRELOAD="$(SAN_PRELOAD)" \
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:$(SAN_ASAN):log_path=$(ROOT)/$(SAN_LOGS)/asan \
  UBSAN_OPTIONS=$(SAN_UBSAN):halt_on_error=1

test-asan: deps system-deps
	cmake -S . -B $(SAN) -G Ninja -DTPJ_SANITIZE=ON -DTPJ_PYTHON_DIR=$(ROOT)/$(SAN_PKG) \
	  -DPython3_EXECUTABLE=$(VPY) -DTPJ_TEST_SEARCH_PATH=$(SITE)
	cmake --build $(SAN)
	cd $(SAN) && ASAN_OPTIONS=detect_leaks=1:$(SAN_ASAN) UBSAN_OPTIONS=$(SAN_UBSAN):halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(ROOT)/tests/cpp/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure --timeout 900
	find $(SAN_PKG) -type l -delete
	for f in python/torch_pjrt/*.py; do \
	  case $$f in */_build_info.py) ;; *) ln -s $(ROOT)/$$f $(SAN_PKG)/ ;; esac; \
	done
	rm -rf $(SAN_LOGS) && mkdir -p $(SAN_LOGS)
	$(SAN_PYENV) $(VPY) -c "import torch_pjrt._C as c; assert c.__file__.startswith('$(ROOT)/$(SAN_PKG)/'), c.__file__"
	$(SAN_PYENV) $(VPY) -m pytest -q -p no:cacheprovider --capture=sys $(SAN_PYTESTS); status=$$?; \
	if [ -n "$$(ls $(SAN_LOGS))" ]; then \
	  cat $(SAN_LOGS)/*; echo "make test-asan: sanitizer reports above (in $(SAN_LOGS))"; exit 1; \
	fi; exit $$status

# make test-install: what a user does. A fresh venv gets torch $(TORCH_VERSION)
# (the local wheel when pip has one), the build requirements of
# pyproject.toml and the CPU plugin; `pip install --no-build-isolation`
# compiles _C against that torch (in a persistent build directory, so ccache
# and ninja make a rerun cheap) and installs it; tests/install/smoke.py then
# runs from a temporary directory outside the checkout. INSTALL_FROM=sdist
# installs from an sdist made by `python -m build --sdist` instead (pip
# unpacks it in a new temporary directory each time: a cold build).
INSTALL_DIR  ?= $(BUILD)-install
INSTALL_FROM ?= dir
IPY          := $(ROOT)/$(INSTALL_DIR)/venv/bin/python
test-install:
	rm -rf $(INSTALL_DIR)/venv $(INSTALL_DIR)/dist
	$(PYTHON) -m venv $(INSTALL_DIR)/venv
	$(IPY) -m pip install -q "torch==$(TORCH_VERSION)" "scikit-build-core>=1.0" "cmake>=3.22" ninja build xla-cpu-pjrt
	if [ "$(INSTALL_FROM)" = sdist ]; then \
	  $(IPY) -m build --sdist --no-isolation --outdir $(INSTALL_DIR)/dist . && \
	  $(IPY) -m pip install --no-build-isolation $$(ls $(ROOT)/$(INSTALL_DIR)/dist/torch_pjrt-*.tar.gz); \
	else \
	  $(IPY) -m pip install --no-build-isolation -C build-dir=$(ROOT)/$(INSTALL_DIR)/pip $(ROOT); \
	fi
	d=$$(mktemp -d) && cp tests/install/smoke.py $$d/ && cd $$d && $(IPY) smoke.py; status=$$?; rm -rf $$d; exit $$status

demo: build
	$(VPY) examples/demo.py

bench: build
	@$(VPY) -c "import matplotlib" 2>/dev/null || $(VPY) -m pip install -q matplotlib
	$(VPY) bench/bench.py $(BENCH_ARGS)

soak: build
	$(VPY) bench/soak.py

# The model zoo (tests/python/zoo.py): every family, lazy and torch.compile,
# training, gradient checkpointing and inference_mode eval. ~15 min on 2 cores.
models: build
	$(VPY) -m pytest -q tests/python/test_models.py --models=all

conformance: build
	$(VPY) -m torch_pjrt.conformance --max-samples 3 --expected tests/python/opinfo_expected_failures.txt

# The pass list's float32 and bfloat16 entries with special values written
# into their samples (about 2 minutes on 2 cores); docs/semantics.md.
conformance-special: build
	$(VPY) -m torch_pjrt.conformance --special-values --dtypes float32,bfloat16 --max-samples 3 \
	  --entries tests/python/opinfo_pass_list.txt --json conformance-special.json \
	  --expected tests/python/special_values_expected_failures.txt --fail-on-stale

# The pass list's float32 entries through their out= forms (fresh, empty,
# non-contiguous and int64 outputs) and in-place variants, against the CPU
# doing the same; docs/device.md ("In-place and out= forms").
conformance-out: build
	$(VPY) -m torch_pjrt.conformance --out --inplace --dtypes float32 --max-samples 3 \
	  --entries tests/python/opinfo_pass_list.txt --json conformance-out.json \
	  --expected tests/python/out_inplace_expected_failures.txt --fail-on-stale

# Other XLA CPU builds on PyPI (README, "Which CPU plugin"). Each goes into
# $(PLUGIN_VENV) with --no-deps (lammps-jax-pjrt-cpu declares a jax it does
# not need) and is named explicitly with TORCH_PJRT_PLUGIN, so the run uses
# it whatever else is installed there. The extension built in $(BUILD) is
# reused: $(PLUGIN_VENV) gets the same torch (TORCH_VERSION).
CPU_PLUGINS ?= xla-cpu-pjrt==0.0.1 fastatomstruct-xla-cpu==2026.6.23 lammps-jax-pjrt-cpu==0.11.2
PLUGIN_VENV ?= .venv-plugins
PLUGIN_PY   := $(PLUGIN_VENV)/bin/python
# Inductor is the same for every plugin: left out of the comparison.
PLUGIN_BENCH_ARGS ?= --no-inductor
# The plugin library a package installed: its one file in a known layout.
PLUGIN_LIB   = $$($(PLUGIN_PY) -c "import importlib.metadata as m, re, sys; \
  name = re.split(r'[<>=!~ ;\[]', sys.argv[1])[0]; \
  libs = [str(f.locate()) for f in m.files(name) if str(f).endswith('.so')]; \
  assert len(libs) == 1, f'{name}: expected one plugin library, found {libs}'; print(libs[0])" "$(PLUGIN)")

plugin-venv: build
	$(MAKE) VENV=$(PLUGIN_VENV) BUILD=$(BUILD) deps
	@$(PLUGIN_PY) -c "import importlib.metadata as m, torch_pjrt as t; assert m.version('torch-pjrt') == t.__version__" \
	  2>/dev/null || $(PLUGIN_PY) -m pip install -q --no-build-isolation --no-deps -e .

test-plugin: plugin-venv
	@test -n "$(PLUGIN)" || { echo "usage: make test-plugin PLUGIN=<pip spec>, e.g. PLUGIN=lammps-jax-pjrt-cpu==0.11.2"; exit 2; }
	$(PLUGIN_PY) -m pip install -q --no-deps "$(PLUGIN)"
	lib=$(PLUGIN_LIB) && echo "make test-plugin: $(PLUGIN) -> $$lib" && \
	  export TORCH_PJRT_PLUGIN=$$lib PJRT_DEVICE=CPU && \
	  $(PLUGIN_PY) -m torch_pjrt info && \
	  (cd $(BUILD) && ctest --output-on-failure --timeout 600) && \
	  $(PLUGIN_PY) -m pytest -q tests/python

# Every build, even after a failure; the summary names those that failed.
test-plugins: plugin-venv
	@failed=""; for p in $(CPU_PLUGINS); do \
	  $(MAKE) --no-print-directory test-plugin PLUGIN=$$p || failed="$$failed $$p"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test-plugins: FAILED on:$$failed"; exit 1; fi; \
	echo "make test-plugins: the suites passed on $(CPU_PLUGINS)"

bench-plugins: plugin-venv
	mkdir -p bench/plugins
	for p in $(CPU_PLUGINS); do \
	  $(MAKE) --no-print-directory bench-plugin PLUGIN=$$p || exit 1; \
	done

bench-plugin: plugin-venv
	$(PLUGIN_PY) -m pip install -q --no-deps "$(PLUGIN)"
	lib=$(PLUGIN_LIB) && TORCH_PJRT_PLUGIN=$$lib PJRT_DEVICE=CPU \
	  $(PLUGIN_PY) bench/bench.py $(PLUGIN_BENCH_ARGS) --out bench/plugins/$$(echo "$(PLUGIN)" | sed 's/[=<>!~].*//').json

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-install build-pip
