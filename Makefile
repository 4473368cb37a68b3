# torch-pjrt: every target works on a fresh machine. `make demo` and
# `make test` install what is missing (a venv in .venv, Python packages,
# GoogleTest from Debian), build, then run.

PYTHON        ?= python3
VENV          ?= .venv
BUILD         ?= build
TORCH_VERSION ?= 2.13.0
VPY           := $(VENV)/bin/python
ROOT          := $(abspath .)
export PATH   := $(ROOT)/$(VENV)/bin:$(PATH)

.PHONY: help deps system-deps build test test-cpp test-python test-asan demo bench soak conformance conformance-special clean

help:
	@echo "make demo       set up, build, run the demo on the default PJRT plugin (CPU)"
	@echo "make test       set up, build, run the C++ (CTest) and Python (pytest) tests"
	@echo "make test-asan  C++ tests under AddressSanitizer (separate build in $(BUILD)-asan)"
	@echo "make bench      step time vs eager PyTorch and torch.compile; writes bench/results.json"
	@echo "make soak       20000 AdamW steps: no compiles after warm-up, host RSS growth < 2% (not in CI)"
	@echo "make conformance  PyTorch's OpInfo samples on pjrt vs CPU; writes conformance.json"
	@echo "make conformance-special  the same with NaN, +-inf, -0.0 and empty inputs; writes conformance-special.json"
	@echo "make clean      remove build directories (keeps .venv)"

$(VPY):
	$(PYTHON) -m venv $(VENV)

# torch is installed only when missing: we build against whatever torch 2.x
# is there. An unpinned `pip install torch` would pull a multi-GB CUDA build.
$(VENV)/.deps-stamp: requirements.txt | $(VPY)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install "torch==$(TORCH_VERSION)"
	$(VPY) -m pip install -r requirements.txt
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
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(ROOT)/$(VPY) \
	  -DTPJ_TEST_SEARCH_PATH=$(SITE) \
	  -DTPJ_REFERENCE_HEADER=$(SITE)/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h

build: deps system-deps $(BUILD)/build.ninja
	cmake --build $(BUILD)
	@$(VPY) -c "import importlib.metadata as m, torch_pjrt as t; assert m.version('torch-pjrt') == t.__version__" \
	  2>/dev/null || $(VPY) -m pip install -q --no-build-isolation --no-deps -e .

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

test-python: build
	$(VPY) -m pytest -q tests/python

test: test-cpp test-python

test-asan: deps system-deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DTPJ_ASAN=ON -DTPJ_BUILD_PYTHON=OFF \
	  -DPython3_EXECUTABLE=$(ROOT)/$(VPY) -DTPJ_TEST_SEARCH_PATH=$(SITE)
	cmake --build $(BUILD)-asan
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 \
	  LSAN_OPTIONS=suppressions=$(ROOT)/tests/cpp/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure --timeout 900

demo: build
	$(VPY) examples/demo.py

bench: build
	$(VPY) bench/bench.py

soak: build
	$(VPY) bench/soak.py

conformance: build
	$(VPY) -m torch_pjrt.conformance --max-samples 3 --expected tests/python/opinfo_expected_failures.txt

# The pass list's float32 and bfloat16 entries with special values written
# into their samples (about 2 minutes on 2 cores); docs/semantics.md.
conformance-special: build
	$(VPY) -m torch_pjrt.conformance --special-values --dtypes float32,bfloat16 --max-samples 3 \
	  --entries tests/python/opinfo_pass_list.txt --json conformance-special.json \
	  --expected tests/python/special_values_expected_failures.txt --fail-on-stale

clean:
	rm -rf $(BUILD) $(BUILD)-asan
