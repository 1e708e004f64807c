"""One self-contained HTML report: figures embedded as data URIs, every row in a table."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import jinja2
import pandas as pd

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "workflow" / "templates"

TABLE_COLUMNS = ["cell_id", "kernel", "mask", "seqlen", "direction", "dtype", "status", "tflops", "median_ms",
                 "p20_ms", "p80_ms", "peak_mem_bytes", "area", "density", "gate_error", "reason"]


def _data_uri(path: str | os.PathLike) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def best_per_mask(df: pd.DataFrame) -> list[dict]:
    """The fastest correct kernel per (mask, direction), at the longest seqlen measured for it."""
    ok = df[df["status"] == "ok"]
    best = []
    for (mask, direction), group in ok.groupby(["mask", "direction"], sort=True):
        longest = group[group["seqlen"] == group["seqlen"].max()]
        top = longest.loc[longest["tflops"].idxmax()]
        best.append({"mask": mask, "direction": direction, "seqlen": int(top["seqlen"]),
                     "kernel": top["kernel"], "tflops": f"{top['tflops']:.4g}"})
    return best


def render(df: pd.DataFrame, figures: dict[str, str | os.PathLike], out: str | os.PathLike, *,
           config: dict | None = None, template: str = "report.html.j2") -> Path:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    columns = [c for c in TABLE_COLUMNS if c in df.columns]
    rows = [[_fmt(v) for v in rec] for rec in df[columns].itertuples(index=False, name=None)]
    env_cols = ["device_name", "hostname", "torch_version", "cuda_version", "driver_version", "libraries",
                "cpu_threads"]
    environments = (df[[c for c in env_cols if c in df.columns]].drop_duplicates().to_dict("records")
                    if len(df) else [])
    failed = df[df["status"] != "ok"][["kernel", "mask", "seqlen", "direction", "status", "reason"]]
    html = env.get_template(template).render(
        best=best_per_mask(df),
        figures=[{"mask": m, "uri": _data_uri(p)} for m, p in figures.items()],
        columns=columns, rows=rows, environments=environments,
        failed=failed.to_dict("records"), counts=df["status"].value_counts().to_dict() if len(df) else {},
        config=json.dumps(config or {}, indent=2, sort_keys=True, default=str),
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(html)
    os.replace(tmp, out)
    return out
