"""The HTML report itself: the answer first, every row, failed cells, escaping, self-containment."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import matplotlib.image as mpimg
import pytest
from pathlib import Path
import report_data as rd

from longca.results import report, tables

HOSTILE_CONFIG = {"kernels": ["fast_kernel"], "masks": ["causal"], "note": "</pre><script>alert(1)</script>",
                  "kernel_options": {"fast_kernel": {"mode": "<b onmouseover=alert(2)>x</b>"}},
                  "cp_strategies": ["ring", "ulysses"], "cp_sizes": [2, 4]}


class Page(HTMLParser):
    """Every element with its attributes, tables by id as lists of rows of cell texts."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.scripts: list[str] = []
        self._table: list[str | None] = []
        self._cell: list[str] | None = None
        self._in_script = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "table":
            self._table.append(attrs.get("id"))
            if attrs.get("id"):
                self.tables[attrs["id"]] = []
        elif tag == "tr" and self._table and self._table[-1]:
            self.tables[self._table[-1]].append([])
        elif tag in ("td", "th") and self._table and self._table[-1]:
            self._cell = []
        elif tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "table" and self._table:
            self._table.pop()
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[self._table[-1]][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_script:
            self.scripts[-1] += data

    def column(self, table: str, header: str) -> list[str]:
        rows = self.tables[table]
        i = rows[0].index(header)
        return [r[i] for r in rows[1:]]


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    return rd.figures(tmp_path_factory.mktemp("figs"), rd.kernels_df(hostile=True), rd.cp_df())


@pytest.fixture(scope="module")
def html(figures, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    report.render(rd.kernels_df(hostile=True), out, cp=rd.cp_df(), figures=figures, ceilings=rd.CEILINGS,
                  config=HOSTILE_CONFIG, masks=["sliding", "causal"])
    return out.read_text()


@pytest.fixture(scope="module")
def page(html):
    return Page(html)


def test_the_first_screen_answers_which_kernel(page):
    rows = page.tables["best-kernel-table"]
    assert rows[0] == ["mask", "forward", "backward"]
    by_mask = {r[0]: r[1:] for r in rows[1:]}
    assert list(by_mask) == ["sliding", "causal"]  # config order
    # causal: slow_kernel is oom at 256, so fast_kernel is the only number there.
    assert by_mask["causal"][0].startswith("fast_kernel 2 TFLOPs/s at 256 tokens")
    assert "the only kernel with a number at that length · fastest at 3/3 lengths" in by_mask["causal"][0]
    # sliding forward: fast_kernel errors at 128 and times out at 256; slow_kernel wins at 256.
    assert by_mask["sliding"][0].startswith("slow_kernel 1 TFLOPs/s at 256 tokens")
    assert "fastest at 2/3 lengths" in by_mask["sliding"][0]
    assert by_mask["sliding"][1].startswith("fast_kernel 1.6 TFLOPs/s at 256 tokens")
    assert "2.00× over slow_kernel (0.8)" in by_mask["sliding"][1]


def test_the_first_screen_answers_per_mask_and_length(page):
    rows = page.tables["seqlen-winner-table"]
    assert rows[0] == ["mask", "64", "128", "256"]
    by_mask = {r[0]: r[1:] for r in rows[1:]}
    assert list(by_mask) == ["sliding", "causal"]  # config order
    # causal at 64: fast_kernel 0.5 vs slow_kernel 0.25 in both directions; never_kernel is X.
    assert by_mask["causal"][0] == ("F fast_kernel 2.00× over slow_kernel B fast_kernel 2.00× over slow_kernel "
                                    "X1 X never_kernel")
    # causal at 256: slow_kernel is oom, so fast_kernel is the only kernel with a number; E names it.
    assert by_mask["causal"][2] == ("F fast_kernel only kernel with a number B fast_kernel only kernel with a number "
                                    "X1 E1 X never_kernel E slow_kernel")
    # sliding at 128: fast_kernel errors forward, so slow_kernel wins there alone.
    assert by_mask["sliding"][1].startswith("F slow_kernel only kernel with a number B fast_kernel 2.00× over")
    # The X / E names are also in the collapsed summary's title.
    titles = [a.get("title") for tag, a in page.elements if tag == "summary"]
    assert "X: never_kernel; E: slow_kernel" in titles


def test_a_length_where_no_kernel_produced_a_number_says_so(tmp_path):
    df = rd.kernels_df()
    df.loc[(df["mask"] == "causal") & (df["seqlen"] == 256) & (df["kernel"] == "fast_kernel"), "status"] = "oom"
    out = report.render(df, tmp_path / "r.html", masks=["causal"])
    rows = Page(out.read_text()).tables["seqlen-winner-table"]
    assert rows[1][3] == ("F — no kernel produced a number (2 oom, 1 unsupported) "
                          "B — no kernel produced a number (2 oom, 1 unsupported) "
                          "X1 E2 X never_kernel E fast_kernel, slow_kernel")


def test_seqlen_answer_formats_margins_ties_and_partial_statuses():
    e = {"runner_up": "b", "ratio": 1.176, "tie": False}
    assert report.margin_text(e) == "1.18× over b"
    assert report.margin_text({**e, "tie": True}) == "tied with b (1.18×)"
    assert report.margin_text({**e, "ratio": 1.0, "tie": True}) == "tied with b"
    assert report.margin_text({**e, "ratio": 1.03, "tie": True, "tied": ["b", "c"]}) == "tied with b, c (1.03×)"
    assert report.margin_text({**e, "unsteady": True}) == "1.18× over b · unsteady"
    assert report.margin_text({"runner_up": None}) == "only kernel with a number"
    cell = {"seqlen": 2048, "entries": {"fwd": None}, "unsupported": [("a", []), ("b", ["bwd"])], "oom": []}
    shown = report.seqlen_answer(cell)
    assert shown["unsupported"] == "a, b (backward only)" and shown["n_unsupported"] == 2 and shown["n_oom"] == 0
    assert shown["seqlen_label"] == "2K" and shown["lines"][0]["why"] == "not measured"


def test_answer_links_point_at_the_rows_behind_them(page):
    ids = {a.get("id") for _, a in page.elements}
    links = [a["href"] for tag, a in page.elements if tag == "a" and a.get("class") == "winner"]
    assert links and all(h.startswith("#") and h[1:] in ids for h in links)
    row_of = {a["id"]: i for i, (tag, a) in enumerate(page.elements) if tag == "tr" and a.get("id")}
    assert "#kernel-row-0" not in links or "kernel-row-0" in row_of


def test_the_first_screen_answers_which_cp_strategy(page):
    rows = page.tables["best-cp-table"]
    assert rows[0] == ["mask", "CP size", "forward", "backward"]
    two = next(r for r in rows[1:] if r[:2] == ["causal", "2"])
    assert two[2].startswith("ring (fast_kernel) 0.9 TFLOPs/s per GPU at 256 tokens (128 per GPU)")
    assert "scaling 0.9 vs cp 1 · 0.45 of the best one GPU (fast_kernel)" in two[2]
    assert "next: ulysses (0.7)" in two[2]
    four = next(r for r in rows[1:] if r[:2] == ["causal", "4"])
    assert four[2].startswith("ring (fast_kernel) 0.9 TFLOPs/s per GPU at 512 tokens (128 per GPU)")
    assert "next:" not in four[2]  # ulysses ran out of memory there


def test_every_cell_is_a_row_and_numbers_sort_by_their_raw_value(page, html):
    kernels, cp = rd.kernels_df(), rd.cp_df()
    assert sorted(page.column("kernel-table", "cell_id")) == sorted(kernels["cell_id"])
    assert sorted(page.column("cp-table", "cell_id")) == sorted(cp["cell_id"])
    assert page.column("cp-table", "scaling").count("0.9") == 8
    # Numeric cells carry their raw value for the sorter; headers say which columns are numeric.
    assert re.search(r'<th data-key="tflops" data-numeric="1"', html)
    assert re.search(r'<td class="num" data-sort="2\.0">2</td>', html)
    for table in ("kernel-table", "cp-table", "failed-table", "area-table"):
        assert any(tag == "table" and a.get("id") == table and "sortable" in a.get("class", "")
                   for tag, a in page.elements)
    assert sum(1 for tag, a in page.elements if tag == "input" and "table-filter" in a.get("class", "")) == 3


def test_every_failed_cell_is_listed_with_status_and_reason(page):
    rows = page.tables["failed-table"]
    assert rows[0] == ["kind", "cell_id", "marker", "status", "reason", "log"]
    failed = {r[1]: r for r in rows[1:]}
    kernels = rd.kernels_df(hostile=True)
    expected = kernels[kernels["status"] != "ok"]
    assert len([r for r in rows[1:] if r[0] == "kernel"]) == len(expected)
    for rec in expected.itertuples():
        row = failed[rec.cell_id]
        assert row[3] == rec.status and row[2] == tables.STATUS_MARKERS[rec.status]
        assert row[4] == " ".join(rec.reason.split())
        assert row[5] == f"results/logs/kernels/{rec.cell_id}.log"
    assert failed["ulysses/causal/bfloat16_fwd_128x4"][:4] == ["cp", "ulysses/causal/bfloat16_fwd_128x4", "E", "oom"]


def test_config_environment_and_error_text_are_escaped(html, page):
    assert "<script>window.__pwned" not in html and 'onerror="window' not in html
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert "<script>alert(1)</script>" not in html and "&lt;/pre&gt;&lt;script&gt;alert(1)" in html
    assert "<b onmouseover" not in html
    assert len(page.scripts) == 1  # only the page's own sorter/filter
    assert not [a for tag, a in page.elements if any(k.startswith("on") for k in a)]  # no event-handler attributes


def test_the_page_is_self_contained(page, html):
    images = [a for tag, a in page.elements if tag == "img"]
    assert len(images) == 1 + 2 * 3 + 3  # matrix, 2 masks × (throughput, memory, memory model), CP scaling, efficiency, model
    for img in images:
        assert img["src"].startswith("data:image/png;base64,")
        data = base64.b64decode(img["src"].split(",", 1)[1])
        pixels = mpimg.imread(io.BytesIO(data), format="png")
        assert (pixels.shape[1], pixels.shape[0]) == (int(img["width"]), int(img["height"]))
        assert img["alt"]
    for tag, attrs in page.elements:
        for key in ("src", "href", "action", "data", "poster"):
            value = attrs.get(key) or ""
            assert not value or value.startswith(("#", "data:")), (tag, key, value)
        assert tag not in ("link", "iframe", "object", "embed", "base")
    assert "@import" not in html and "url(" not in html
    assert "http://" not in html and "https://" not in html


def test_every_figure_has_a_caption_saying_what_and_how(page, html):
    figures = re.findall(r"<figure id=\"([^\"]+)\">.*?<figcaption>(.*?)</figcaption>", html, re.S)
    assert {f for f, _ in figures} == {"fig-matrix", "fig-throughput-causal", "fig-throughput-sliding",
                                       "fig-memory-causal", "fig-memory-sliding", "fig-memory-model-causal",
                                       "fig-memory-model-sliding", "fig-cp-scaling-causal",
                                       "fig-cp-efficiency-causal", "fig-cp-predicted-causal"}
    captions = dict(figures)
    thr = captions["fig-throughput-causal"]
    assert "4 · area · heads_q · head_dim · batch" in thr and "median" in thr and "CUDA events" in thr
    assert "X unsupported, E out of memory, W failed the correctness gate" in thr
    assert "bfloat16: 3 TFLOPs/s (n = 8192)" in thr
    assert "tokens per rank" in captions["fig-cp-efficiency-causal"]
    assert "a prediction, not a measurement" in captions["fig-cp-predicted-causal"]


def test_methodology_environment_and_configuration(page, html):
    assert "forward FLOPs = 4 · <i>area</i> · heads_q · head_dim · batch" in html
    areas = page.tables["area-table"]
    assert areas[0][:5] == ["mask", "pattern", "seqlen", "area", "density"]
    assert ["causal", "causal", "256", "32768", "0.5"] in [r[:5] for r in areas[1:]]
    assert ["fwd", "bfloat16", "0.02"] in page.tables["tolerance-table"]
    assert page.tables["ceiling-table"][1][:3] == ["bfloat16", "8192", "3"]
    devices = page.tables["env-devices"]
    assert devices[0] == ["device", "device name", "CPU", "CPU threads", "host", "cells"]  # no GPU slot recorded
    assert devices[1] == ["cuda", "Synthetic GPU", "Synthetic CPU", "2", "synthetic-host", "36"]
    assert page.tables["env-software"][0] == ["torch", "CUDA", "kernel libraries", "cells"]
    assert page.tables["env-software"][1] == ["2.13.0", "12.8", "triton 3.5.0", "36"]
    assert page.tables["env-cp"][0][:2] == ["backend", "device name"] and page.tables["env-cp"][1][0] == "nccl"
    assert "2 warm-up calls then 5 timed calls" in html
    software = dict(r for r in page.tables["report-software"])
    assert {"python", "longca", "matplotlib", "jinja2"} <= set(software)
    assert "cp_sizes:" in html and "- ring" in html


def test_without_cp_cells_the_report_says_so(figures, tmp_path):
    out = report.render(rd.kernels_df(), tmp_path / "r.html", cp=rd.empty_cp_df(),
                        figures=report.Figures(throughput=figures["throughput"], matrix=figures["matrix"]),
                        config={"cp_strategies": [], "cp_sizes": []})
    page = Page(out.read_text())
    assert "best-cp-table" not in page.tables and "cp-table" not in page.tables
    text = out.read_text()
    assert "No CP cells in this run (config <code>cp_strategies</code> / <code>cp_sizes</code> are empty)" in text
    assert "No CP cells in this run: nothing to plot." in text
    assert "best-kernel-table" in page.tables
    # CP configured, but cp_masks named only masks that `masks` leaves out (longca.config drops them).
    out = report.render(rd.kernels_df(), tmp_path / "r.html", cp=rd.empty_cp_df(),
                        figures=report.Figures(throughput=figures["throughput"], matrix=figures["matrix"]),
                        config={"cp_strategies": ["ring"], "cp_sizes": [2], "cp_masks": []})
    assert ("No CP cells in this run (config: <code>cp_masks</code> names none of the masks in "
            "<code>masks</code>)") in out.read_text()


def test_cpu_runs_say_memory_is_not_recorded(figures, tmp_path):
    out = report.render(rd.kernels_df(device="cpu"), tmp_path / "r.html", figures=figures)
    text = out.read_text()
    assert "Peak memory is recorded on GPU only; these cells ran on cpu" in text
    assert 'id="fig-memory-causal"' not in text
    assert "No machine ceiling was measured for this report." in text


def test_an_empty_kernel_table_still_renders(tmp_path):
    empty = rd.kernels_df().iloc[0:0]
    text = report.render(empty, tmp_path / "r.html").read_text()
    assert "No kernel cells in this run." in text and "0 kernel cells" in text


def test_the_memory_caption_says_the_figure_is_one_calls_need_however_the_call_was_timed():
    df = rd.kernels_df()
    eager = report.caption("memory", df, "causal", rd.CEILINGS)
    df.loc[df["mask"] == "causal", "timed_via"] = "graph"
    graphed = report.caption("memory", df, "causal", rd.CEILINGS)
    assert eager == graphed and "one eager call" in eager and "after one unmeasured call" in eager


def test_provenance_notes_name_what_differs_between_rows():
    df = rd.kernels_df()
    assert tables.provenance_notes(df) == [] or all(isinstance(n, str) for n in tables.provenance_notes(df))
    mixed = df.copy()
    ok = mixed["status"] == "ok"
    mixed.loc[ok, "device_name"] = ["GPU A" if i % 2 else "GPU B" for i in range(int(ok.sum()))]
    mixed["kernel_library"] = None
    mixed.loc[ok, "kernel_library"] = ["torch 1" if i % 2 else "torch 2" for i in range(int(ok.sum()))]
    notes = " ".join(tables.provenance_notes(mixed))
    assert "2 devices (GPU A, GPU B)" in notes and "different library versions: torch 1; torch 2" in notes
    assert "more than one run" not in notes  # one machine, one day
    # Machines that share a name still tell their runs apart by the day each row was timed.
    mixed.loc[ok, "timed_at"] = ["2026-11-24T06:00:00+00:00" if i % 2 else "2026-11-26T16:00:00+00:00"
                                 for i in range(int(ok.sum()))]
    mixed.loc[ok, "timed_load_1m"] = [0.5 if i % 2 else 6.25 for i in range(int(ok.sum()))]
    notes = " ".join(tables.provenance_notes(mixed))
    assert "more than one run, on 2 days (2026-11-24 to 2026-11-26); the host's 1-minute load average " \
           "when timed ranged 0.5–6.2" in notes
    ceiling = {"matmul": [{"dtype": d, "tflops": 1e-9} for d in set(df["dtype"])]}
    assert "exceed the matmul ceiling" in " ".join(tables.provenance_notes(df, ceiling))


def test_a_cp_row_above_the_best_one_gpu_kernel_is_flagged_not_shown_as_a_win(tmp_path):
    kernels, cp = rd.kernels_df(), rd.cp_df()
    assert not any("CP rows" in n for n in tables.provenance_notes(kernels, cp=tables.cp_table(cp, kernels)))
    # seqlen 128: the best one GPU does 1.0 forward and 0.8 backward.
    cp.loc[cp["cell_id"] == "ring/causal/bfloat16_fwd_64x2", "tflops_per_gpu"] = 1.25
    cp.loc[cp["cell_id"] == "ring/causal/bfloat16_bwd_64x2", "tflops_per_gpu"] = 0.82   # 1.025: a tie with 1
    table = tables.cp_table(cp, kernels)
    notes = " ".join(tables.provenance_notes(kernels, cp=table, tie_margin=0.05))
    assert "CP rows faster per GPU than the best one-GPU kernel on the same problem: 1 (up to 1.25×, " \
           "ring/causal/bfloat16_fwd_64x2 against fast_kernel)" in notes
    out = report.render(kernels, tmp_path / "r.html", cp=cp, config={"tie_margin": 0.05})
    assert "not as a win" in out.read_text()


def test_the_fits_table_says_the_longest_ok_length_its_need_and_the_first_oom():
    df = rd.kernels_df(device="cuda")
    causal = (df["mask"] == "causal") & (df["kernel"] == "fast_kernel") & (df["direction"] == "fwd")
    longest = df.loc[causal & (df["status"] == "ok"), "seqlen"].max()
    df.loc[causal & (df["seqlen"] == longest), ["status", "peak_mem_bytes"]] = ["oom", None]
    entry = next(e for e in tables.longest_fits(df) if (e["kernel"], e["mask"], e["direction"]) ==
                 ("fast_kernel", "causal", "fwd"))
    below = df.loc[causal & (df["status"] == "ok"), "seqlen"].max()
    assert entry["longest_ok"] == below and entry["first_oom"] == longest
    assert entry["peak_mem_bytes"] == below * 2 ** 20
    assert tables.longest_fits(rd.kernels_df(device="cpu")) == []  # a CPU run: no GPU memory to plan with


def test_each_caption_has_one_source_for_both_reports():
    """The HTML report's captions begin with the caption files Snakemake's report renders."""
    from longca.results import figure_captions

    from longca.results.figures import FIGURES

    df = rd.kernels_df()
    throughput, memory = (report.caption(name, df, "causal", rd.CEILINGS) for name in ("throughput", "memory"))
    assert throughput.startswith(figure_captions.text("throughput", "causal"))
    assert memory == figure_captions.text("memory", "causal")
    assert "mask causal" in memory and "{{" not in throughput
    # The HTML report shows no reStructuredText markup (``longca predict`` reads as plain words).
    assert all("``" not in figure_captions.text(name, "causal") for name in figure_captions.FIGURES)
    assert "longca predict's" in figure_captions.text("cp_predicted", "causal")
    # Every declared figure has its caption file, and the rules take each figure's caption by its name.
    assert set(figure_captions.FIGURES) == {*FIGURES, "html_report"}
    assert all(figure_captions.path(name).exists() for name in figure_captions.FIGURES)
    rules = "".join(p.read_text() for p in (Path(report.__file__).parents[2] / "workflow" / "rules").glob("*.smk"))
    assert "caption=figure_captions.path(spec.name)" in rules and 'figure_captions.path("html_report")' in rules
    with pytest.raises(KeyError, match="no caption for figure 'nope'"):
        figure_captions.path("nope")


def test_a_cpu_report_says_its_timings_are_indicative_and_a_gpu_report_does_not(tmp_path):
    cpu = report.render(rd.kernels_df(device="cpu"), tmp_path / "cpu.html").read_text()
    gpu = report.render(rd.kernels_df(), tmp_path / "gpu.html").read_text()
    assert 'class="note cpu-indicative"' in cpu and "read them as indicative" in cpu
    assert "cpu-indicative" not in gpu
