"""The pinned list of skips (tests/expected_skips.txt, checked by tests/conftest.py when
``CGX_TEST_EXPECTED_SKIPS`` names it, as ``make test`` does): its rule, and that every pattern
names a test file that exists."""

import os

from conftest import skip_mismatch

HERE = os.path.dirname(os.path.abspath(__file__))


def _patterns():
    with open(os.path.join(HERE, "expected_skips.txt")) as f:
        return [p for p in (ln.split("#")[0].strip() for ln in f) if p]


def test_an_unlisted_skip_and_an_unused_pattern_are_both_reported():
    patterns = ["tests/test_gpu_two_ranks.py::*", "tests/test_lightning.py::*"]
    skipped = ["tests/test_gpu_two_ranks.py::test_a", "tests/test_bench_diloco.py"]
    assert skip_mismatch(skipped, patterns) == (["tests/test_bench_diloco.py"],
                                                ["tests/test_lightning.py::*"])  # fmt: skip
    assert skip_mismatch(skipped[:1], patterns[:1]) == ([], [])


def test_every_pattern_names_an_existing_test_file():
    for pattern in _patterns():
        path = pattern.split("::")[0]
        assert os.path.isfile(os.path.join(os.path.dirname(HERE), path)), pattern
