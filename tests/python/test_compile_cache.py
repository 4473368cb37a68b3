"""The on-disk compile cache across processes, and its failure modes."""

import os

from conftest import run_python

PROGRAM = (
    "import torch, torch_pjrt\n"
    "x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to('pjrt')\n"
    "y = ((x @ x.t()).relu() + 1).sum()\n"
    "print('value', y.item())\n"
    "c = torch_pjrt.metrics.counters()\n"
    "print('compiles', c.get('compiles', 0), 'disk', c.get('disk_cache_hits', 0), 'corrupt', c.get('disk_cache_corrupt', 0))\n"
)


def run(cache_dir, via_api=False, **extra_env):
    code = PROGRAM
    env = {"TORCH_PJRT_CACHE_DIR": str(cache_dir), **extra_env}
    if via_api:
        code = f"import torch_pjrt; torch_pjrt.runtime.initialize_cache({str(cache_dir)!r})\n" + PROGRAM
        env = {"TORCH_PJRT_CACHE_DIR": None}
    r = run_python(code, **env)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    value = float(lines["value"])
    parts = lines["compiles"].split()
    return value, int(parts[0]), int(parts[2]), int(parts[4])


def entries(cache_dir):
    out = []
    for root, _, files in os.walk(cache_dir):
        out += [os.path.join(root, f) for f in files if f.endswith(".pjrtexe")]
    return out


def test_second_process_compiles_nothing(tmp_path):
    v1, compiles1, disk1, _ = run(tmp_path)
    assert compiles1 == 1 and disk1 == 0
    assert len(entries(tmp_path)) == 1
    v2, compiles2, disk2, _ = run(tmp_path)
    assert compiles2 == 0 and disk2 == 1
    assert v1 == v2


def test_xla_flags_are_part_of_the_disk_key(tmp_path):
    # The plugin compiles differently under other XLA_FLAGS: a program
    # compiled under one setting is never loaded under another.
    _, compiles1, _, _ = run(tmp_path, XLA_FLAGS=None)
    _, compiles2, disk2, _ = run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert compiles1 == 1 and compiles2 == 1 and disk2 == 0
    _, compiles3, disk3, _ = run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert compiles3 == 0 and disk3 == 1
    assert len({os.path.dirname(e) for e in entries(tmp_path)}) == 2


def test_initialize_cache_api(tmp_path):
    run(tmp_path, via_api=True)
    _, compiles, disk, _ = run(tmp_path, via_api=True)
    assert compiles == 0 and disk == 1


def test_truncated_entry_is_recompiled_not_trusted(tmp_path):
    v1, _, _, _ = run(tmp_path)
    (path,) = entries(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    v2, compiles, disk, corrupt = run(tmp_path)
    assert (compiles, disk, corrupt) == (1, 0, 1)
    assert v2 == v1
    # the bad entry was replaced by a good one
    _, compiles, disk, corrupt = run(tmp_path)
    assert (compiles, disk, corrupt) == (0, 1, 0)


def test_flipped_byte_is_detected(tmp_path):
    run(tmp_path)
    (path,) = entries(tmp_path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    _, compiles, _, corrupt = run(tmp_path)
    assert compiles == 1 and corrupt == 1


def test_an_entry_copied_over_another_is_not_run_for_it(tmp_path):
    # two programs' entries, each copied over the other's file (a merged
    # cache directory): each passes its checksum, but names another key
    other = PROGRAM.replace("relu()", "sigmoid()")
    v1, _, _, _ = run(tmp_path)
    assert run_python(other, TORCH_PJRT_CACHE_DIR=str(tmp_path)).returncode == 0
    a, b = sorted(entries(tmp_path), key=os.path.getmtime)
    data_a, data_b = open(a, "rb").read(), open(b, "rb").read()
    open(a, "wb").write(data_b)
    open(b, "wb").write(data_a)
    v2, compiles, disk, corrupt = run(tmp_path)
    assert (v2, compiles, disk, corrupt) == (v1, 1, 0, 1)


def test_an_entry_that_is_no_file_is_recompiled_and_a_readonly_cache_keeps_bad_entries(tmp_path):
    v1, _, _, _ = run(tmp_path)
    (path,) = entries(tmp_path)
    os.remove(path)
    os.mkdir(path)  # a directory where the entry should be (a FIFO would block an open)
    v2, compiles, disk, corrupt = run(tmp_path)
    assert (v2, compiles, disk, corrupt) == (v1, 1, 0, 1) and os.path.isdir(path)
    os.rmdir(path)
    run(tmp_path)
    open(path, "r+b").truncate(10)
    code = f"import torch_pjrt; torch_pjrt.runtime.initialize_cache({str(tmp_path)!r}, readonly=True)\n" + PROGRAM
    r = run_python(code, TORCH_PJRT_CACHE_DIR=None)
    assert r.returncode == 0 and f"value {v1}" in r.stdout, r.stderr
    assert os.path.getsize(path) == 10  # read-only: used where good, never written nor deleted


# An unusable directory costs one warning (torch_pjrt.PjrtWarning, from the
# runtime through Python's warnings), never the run.
WARNINGS_PROGRAM = (
    "import warnings\n"
    "warnings.simplefilter('always')\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    import torch, torch_pjrt\n"
    "    for n in (3, 4):\n"
    "        assert (torch.ones(n, device='pjrt') * 2).sum().item() == 2 * n\n"
    "for w in caught:\n"
    "    print('warning', w.category.__name__, w.message)\n"
    "print('compiles', torch_pjrt.metrics.counters().get('compiles', 0))\n"
)


def _unwritable_dir(tmp_path):
    if os.geteuid() == 0:  # root writes through permissions
        return "/proc/self/tpj-cache"
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o555)
    return str(d)


def test_unusable_directories_give_one_warning_each_and_the_run_goes_on(tmp_path):
    plain_file = tmp_path / "a-file"
    plain_file.write_text("")
    unwritable = _unwritable_dir(tmp_path)
    for cache_dir, dump_dir in ((plain_file, plain_file / "dumps"), (unwritable, unwritable + "/dumps")):
        r = run_python(WARNINGS_PROGRAM, TORCH_PJRT_CACHE_DIR=cache_dir, TORCH_PJRT_DUMP_DIR=dump_dir)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[-1] == "compiles 2"  # in memory only
        warned = lines[:-1]
        assert len(warned) == 2, lines
        assert warned[0].startswith(f"warning PjrtWarning TORCH_PJRT_CACHE_DIR='{cache_dir}' cannot be used")
        assert warned[0].endswith("compiled programs are cached in memory only")
        assert warned[1] == f"warning PjrtWarning TORCH_PJRT_DUMP_DIR='{dump_dir}' cannot be created or written: " \
                            "programs are not dumped"


def test_a_missing_dump_directory_is_created(tmp_path):
    dump_dir = tmp_path / "not" / "yet"
    r = run_python(WARNINGS_PROGRAM, TORCH_PJRT_DUMP_DIR=dump_dir, TORCH_PJRT_CACHE_DIR=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["compiles 2"]
    assert len([f for f in os.listdir(dump_dir) if f.endswith(".mlir")]) == 2
