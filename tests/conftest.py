"""Fixtures shared by the test modules."""

import importlib.util
import os

import pytest

from torch_cgx import codec

# triton decorates its own helpers (tl.sum, ...) for the interpreter or the compiler when it is
# first imported, and a process cannot switch afterwards; torch imports it on the way too (a
# profiler or dispatch mode reaching torch._dynamo). Where TRITON_INTERPRET is unset (a CPU run:
# the GPU check sets 0), it is imported here first, under the interpreter, so that the Triton
# tests run on CPU tensors whichever module comes first (tests/triton_testing.py).
if "TRITON_INTERPRET" not in os.environ and importlib.util.find_spec("triton") is not None:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture
def restore_threads():
    """Restores the codec's thread count after a test that changes it."""
    before = codec.num_threads()
    yield
    codec.set_num_threads(before)


# ---- the pinned list of skips (make test: CGX_TEST_EXPECTED_SKIPS=tests/expected_skips.txt) ----
# A test that skips because an install broke (a module-level importorskip of transformers, say)
# would otherwise pass unseen: with the variable set, the run fails unless the skipped tests are
# exactly those the file's patterns (fnmatch, one per line, # comments) describe, each pattern
# matching at least one.

_SKIPPED = []


def pytest_collectreport(report):
    if report.skipped:  # a whole module skipped at import
        _SKIPPED.append(report.nodeid)


def pytest_runtest_logreport(report):
    if report.skipped and report.when in ("setup", "call"):
        _SKIPPED.append(report.nodeid)


def skip_mismatch(skipped, patterns):
    """(skipped nodeids no pattern matches, patterns no skipped nodeid matches)."""
    from fnmatch import fnmatchcase

    unexpected = sorted(s for s in set(skipped) if not any(fnmatchcase(s, p) for p in patterns))
    unused = [p for p in patterns if not any(fnmatchcase(s, p) for s in skipped)]
    return unexpected, unused


def pytest_sessionfinish(session, exitstatus):
    import os

    path = os.environ.get("CGX_TEST_EXPECTED_SKIPS")
    if not path or exitstatus not in (0, 1):
        return
    with open(path) as f:
        patterns = [ln.split("#")[0].strip() for ln in f]
    unexpected, unused = skip_mismatch(_SKIPPED, [p for p in patterns if p])
    if unexpected or unused:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"skipped, not in {path}: {s}" for s in unexpected]
        lines += [f"in {path}, but nothing skipped: {p}" for p in unused]
        for line in lines:
            reporter.write_line("SKIP LIST: " + line, red=True)
        session.exitstatus = 1


@pytest.fixture(scope="module")
def lighthouse():
    """A torchft Lighthouse on 127.0.0.1 for the tests of DiLoCo on torchft (its address)."""
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=3000, heartbeat_timeout_ms=1000
    )
    yield "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]
    server.shutdown()
