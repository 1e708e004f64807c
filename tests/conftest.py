import os
from pathlib import Path

import pytest

# The shared helpers' asserts say what they compared, as a test's own do.
pytest.register_assert_rewrite("stand_in", "tiny")

REPO = Path(__file__).resolve().parent.parent

# The harness's own failure kernels (test_wrong, test_oom) are registered for the tests, and for the
# Snakemake and longca subprocesses the tests start (they inherit the environment).
os.environ["LONGCA_TEST_KERNELS"] = "1"


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
