"""Fixtures shared by the test modules."""

import pytest

from torch_cgx import codec


@pytest.fixture
def restore_threads():
    """Restores the codec's thread count after a test that changes it."""
    before = codec.num_threads()
    yield
    codec.set_num_threads(before)
