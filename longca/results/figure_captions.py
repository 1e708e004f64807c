"""The figures' captions, one source for both reports.

Each caption is a file under ``captions/`` (package data): Snakemake's ``report(..., caption=...)``
takes the file itself (``path``) and renders it for ``snakemake --report``, with the figure's mask as
``snakemake.wildcards.mask``; LongCA's own HTML report renders the same file (``text``) and adds what
only the rows know (the mask's pattern and density, the timing used, the ceiling's value).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jinja2

from . import figures

CAPTIONS = Path(__file__).resolve().parent / "captions"
# Every figure's (figures.FIGURES), and the HTML report's own in snakemake --report.
FIGURES = (*figures.FIGURES, "html_report")


def path(figure: str) -> Path:
    """The caption file of ``figure`` (one of ``FIGURES``)."""
    if figure not in FIGURES:
        raise KeyError(f"no caption for figure {figure!r} (captions: {', '.join(FIGURES)})")
    return CAPTIONS / f"{figure}.rst"


def text(figure: str, mask: str | None = None) -> str:
    """The caption of ``figure`` as one paragraph, for ``mask`` where the figure is drawn per mask."""
    template = jinja2.Template(path(figure).read_text(), undefined=jinja2.StrictUndefined)
    rendered = template.render(snakemake=SimpleNamespace(wildcards=SimpleNamespace(mask=mask)))
    # reStructuredText's inline literals (``longca predict``) read as plain words in the HTML report.
    return " ".join(rendered.replace("``", "").split())
