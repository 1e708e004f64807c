"""The `longca` command itself: its version and its help read as text."""

import subprocess

import longca


def test_version_and_help_read_as_plain_text():
    version = subprocess.run(["longca", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"longca {longca.__version__}"
    help_ = subprocess.run(["longca", "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "run-cell" in help_.stdout
    assert "``" not in help_.stdout  # no reStructuredText markup on a terminal
