"""make test's pytest shards (tests/run_pytest.py, conftest.assign_shards):
every test file runs in exactly one shard."""
import glob
import os

import pytest

from conftest import DEFAULT_WEIGHT, FILE_SECONDS, assign_shards

HERE = os.path.dirname(__file__)
FILES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "test_*.py")))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_each_file_is_in_exactly_one_shard(n):
    shards = assign_shards(FILES, n)
    assert len(shards) == n
    flat = [f for s in shards for f in s]
    assert sorted(flat) == FILES


def test_two_shards_are_balanced_and_the_weights_name_real_files():
    assert set(FILE_SECONDS) <= set(FILES), set(FILE_SECONDS) - set(FILES)
    load = [sum(FILE_SECONDS.get(f, DEFAULT_WEIGHT) for f in s) for s in assign_shards(FILES, 2)]
    assert max(load) - min(load) <= 0.05 * sum(load), load
