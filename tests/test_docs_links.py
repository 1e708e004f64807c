"""Every relative link in the READMEs, docs/ and the lab's pages names a file or folder that exists."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _broken(md: Path) -> list[str]:
    bad = []
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # links inside code are examples
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if path and not (md.parent / path).exists():
            bad.append(target)
    return bad


def test_relative_links_resolve():
    pages = [REPO / "README.md", REPO / "config" / "README.md", REPO / "scripts" / "README.md",
             *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "lab").rglob("*.md"))]
    broken = {str(p.relative_to(REPO)): b for p in pages if (b := _broken(p))}
    assert not broken, broken
