#!/usr/bin/env bash
# The GPU check, one script for a short lease of an NVIDIA machine that has
# torch (CUDA build), CMake, Ninja and jax-cuda13-pjrt installed but no
# network: builds torch-pjrt against that torch with the system's g++ (CXX:
# GPU_CHECK_CXX, default /usr/bin/g++), checks the plugin and the float32
# product precision, runs the demo, `bench/bench.py` against eager CUDA
# (with the matmul-bound bfloat16 step) and a subset of the Python tests,
# all with PJRT_DEVICE=CUDA. Each part has its own time limit, so a hang
# costs that part only.
#
#     bench/gpu_check.sh OUT_DIR        (README.md, "On a GPU", has its results)
#
# Writes OUT_DIR/parts.log (every part's output, the first test shard's
# too), OUT_DIR/tests.log (the other test shards'), OUT_DIR/results.json and .png (the bench) and prints each part's
# tail. Environment: PYTHON (default python3), BENCH_S and TESTS_S (seconds
# for those two parts), TEST_FILES, SHARDS.
set -u
OUT=${1:?usage: bench/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
PY=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3} on PATH"; exit 1; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PJRT_DEVICE=CUDA PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$ROOT/python
# The system's g++: the GPU machine's default CXX links libstdc++ statically
# into shared libraries, which CMake refuses (CMakeLists.txt says why).
export CXX=${GPU_CHECK_CXX:-/usr/bin/g++}
start=$(date +%s)
failed=""

LOGS=$(mktemp -d)
part() {  # part NAME SECONDS COMMAND...: runs it, its log appended to $OUT/parts.log
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s) at +$(( $(date +%s) - start ))s"
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  { echo "=== $name: exit $rc"; cat "$LOGS/$name.log"; } >> "$OUT/parts.log"
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  echo "=== $name: exit $rc after +$(( $(date +%s) - start ))s"
  [ "$rc" = 0 ] || failed="$failed $name"
  return $rc
}

part info 60 bash -c "nvidia-smi -L; nproc; $PY -c 'import sys, torch; print(sys.version); print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name())'; $PY -m pip list 2>/dev/null | grep -i -E '^(jax|torch|triton|pytest)'"

# CMAKE_CXX_COMPILER too: a build-gpu/ configured before keeps its compiler otherwise.
part build 300 bash -c "cmake -S . -B build-gpu -G Ninja -DPython3_EXECUTABLE=$PY -DCMAKE_CXX_COMPILER=$CXX \
  -DTPJ_BUILD_TESTS=OFF && cmake --build build-gpu -j $(nproc)" || exit 1

TAIL=40 part plugin 120 "$PY" - <<'EOF' || exit 1
import time
import torch, torch_pjrt
print(torch_pjrt.runtime.plugin_info())
print("devices:", torch_pjrt.runtime.devices())
g = torch.Generator().manual_seed(0)
a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
exact = a.double() @ b.double()
dev = torch_pjrt.device()
for prec in ("highest", "high"):
    torch.set_float32_matmul_precision(prec)
    t0 = time.perf_counter()
    got = (a.to(dev) @ b.to(dev)).cpu()
    err = ((got.double() - exact).abs().max() / exact.abs().max()).item()
    print(f"float32 matmul, precision {prec}: max error {err:.2e} relative to the largest entry ({time.perf_counter() - t0:.2f}s)")
torch.set_float32_matmul_precision("highest")
cpu = a @ b
print("pjrt vs CPU float32 matmul, highest:", ((a.to(dev) @ b.to(dev)).cpu() - cpu).abs().max().item())
x = torch.randn(8, 3, 32, 32, generator=g)
w = torch.randn(16, 3, 3, 3, generator=g)
print("conv2d pjrt vs CPU:", (torch.nn.functional.conv2d(x.to(dev), w.to(dev)).cpu()
                              - torch.nn.functional.conv2d(x, w)).abs().max().item())
if torch.cuda.is_available():
    y = torch.ones(4, device="cuda")
    print("eager CUDA beside pjrt:", (y + 1).sum().item(), torch.cuda.mem_get_info())
print("memory stats:", torch_pjrt.runtime.memory_stats(0))
EOF

part demo 120 "$PY" examples/demo.py --steps 200

# No inductor and no new-process first steps: XLA GPU's first compiles take
# seconds each, and the lease is short.
TAIL=40 part bench "${BENCH_S:-240}" "$PY" bench/bench.py --quick --no-inductor --no-first-step --eager-device cuda \
  --matmul --rounds 3 --out "$OUT/results.json"

# A subset: on the GPU the tests are bound by XLA's compiles (13 files did
# not finish in 100 s on 8 shards).
files=${TEST_FILES:-test_training_parity test_dynamo test_autocast test_replay test_generation}
paths=$(for f in $files; do printf 'tests/python/%s.py ' "$f"; done)
timeout_arg=$("$PY" -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120")  # a hung test fails alone
TAIL=60 part tests "${TESTS_S:-240}" "$PY" tests/run_pytest.py --shards "${SHARDS:-5}" --log-dir "$LOGS" -q -rf \
  -p no:cacheprovider $timeout_arg $paths
for f in "$LOGS"/pytest-shard-*.log; do
  echo "--- $f" | tee -a "$OUT/tests.log"; cat "$f" >> "$OUT/tests.log"; grep -E "passed|failed|error" "$f" | tail -3
done
echo "=== all parts done at +$(( $(date +%s) - start ))s${failed:+; failed:$failed}"
[ -z "$failed" ]
