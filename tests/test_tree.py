"""The tracked tree stays small (issue 72): a published run keeps its page, its Parquet tables, its
environment and the figures its page shows; reports, cell archives, logs and GPU clock traces are
rebuilt or left in git history.  No tracked file over 1 MB, the whole tracked tree under 10 MB
(the sizes of the tracked files present in the work tree)."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILE_LIMIT = 1_000_000
TREE_LIMIT = 10_000_000


def over_limits(sizes: dict[str, int], file_limit: int = FILE_LIMIT, tree_limit: int = TREE_LIMIT) -> list[str]:
    """What breaks the limits, in words: each file over file_limit, and the tree's total over tree_limit."""
    problems = [f"{path}: {size:,} bytes > {file_limit:,}" for path, size in sorted(sizes.items()) if size > file_limit]
    total = sum(sizes.values())
    if total > tree_limit:
        largest = ", ".join(f"{p} {s:,}" for p, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
        problems.append(f"tracked tree: {total:,} bytes > {tree_limit:,} (largest: {largest})")
    return problems


def tracked_sizes() -> dict[str, int]:
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [p for p in proc.stdout.decode().split("\0") if p]
    return {p: (REPO / p).stat().st_size for p in paths if (REPO / p).is_file()}


@pytest.mark.parametrize(("sizes", "broken"), [
    ({"a.md": 10, "b.parquet": 20}, []),
    ({"a.md": 10, "docs/results/x/report.html": FILE_LIMIT + 1}, ["docs/results/x/report.html"]),
    ({f"f{i}.parquet": FILE_LIMIT for i in range(10)} | {"g.md": 1}, ["tracked tree"]),
    ({"exactly.parquet": FILE_LIMIT} | {f"f{i}.md": (TREE_LIMIT - FILE_LIMIT) // 9 for i in range(9)}, []),
])
def test_the_limits_catch_a_large_file_and_a_large_tree(sizes, broken):
    problems = over_limits(sizes)
    assert len(problems) == len(broken)
    for problem, name in zip(problems, broken):
        assert problem.startswith(name)


def test_no_tracked_file_over_1_mb_and_the_tracked_tree_under_10_mb():
    sizes = tracked_sizes()
    assert sizes, "git ls-files listed nothing"
    assert not over_limits(sizes), "\n".join(over_limits(sizes))
