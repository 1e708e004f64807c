"""The report in a real headless Chromium: loads cleanly, images decode, tables sort and filter, and
the first screen is a real picture.  (The report of a real Snakemake run is opened in test_workflow.)"""

from __future__ import annotations

import io

import pytest
import report_data as rd
from browser import Chromium, chromium  # noqa: F401 — chromium is a fixture
from PIL import Image

from longca.results.figures import FIGURES
from longca.results import report

pytestmark = pytest.mark.slow
WIDTH, HEIGHT = 1280, 900


@pytest.fixture(scope="module")
def report_url(tmp_path_factory):
    """A report with every kind of figure, failed cells, CP rows and hostile text in a reason."""
    out = tmp_path_factory.mktemp("browser-report")
    k, cp = rd.kernels_df(hostile=True), rd.cp_df()
    figs = rd.figures(out, k, cp)
    path = report.render(k, out / "report.html", cp=cp, figures=figs, ceilings=rd.CEILINGS,
                         config={"note": "<script>window.__pwned = 3</script>"})
    return path.resolve().as_uri()


@pytest.fixture(scope="module")
def browser(chromium):  # noqa: F811
    with Chromium(chromium, width=WIDTH, height=HEIGHT) as page:
        yield page


@pytest.fixture
def page(browser, report_url):
    browser.navigate(report_url)
    return browser


def column(page, table: str, key: str) -> list[str]:
    """The visible rows' raw values of one column (what the sorter compares)."""
    return page.evaluate(f"""(function () {{
        var t = document.getElementById('{table}');
        var i = Array.prototype.findIndex.call(t.tHead.rows[0].cells, function (th) {{ return th.dataset.key === '{key}'; }});
        return Array.prototype.filter.call(t.tBodies[0].rows, function (r) {{ return r.style.display !== 'none'; }})
            .map(function (r) {{ var c = r.cells[i]; return c.hasAttribute('data-sort') ? c.dataset.sort : c.textContent; }});
    }}())""")


def test_loads_with_no_console_error_and_nothing_from_the_network(page):
    assert page.evaluate("document.readyState") == "complete"
    assert page.console_errors() == []
    assert page.evaluate("typeof window.__pwned") == "undefined"  # escaped text never ran
    urls = page.requested_urls()
    assert urls and all(u.startswith(("file://", "data:")) for u in urls), urls


def test_every_image_decodes_with_a_real_size(page):
    sizes = page.evaluate("Promise.all(Array.prototype.map.call(document.images, function (i) {"
                          " return i.decode().then(function () { return [i.naturalWidth, i.naturalHeight,"
                          " i.getBoundingClientRect().width]; }); }))", await_promise=True)
    # Every declared figure: once, per kernel mask (2 here) or per CP mask (1 here).
    per = {None: 1, "mask": 2, "cp_mask": 1}
    assert len(sizes) == sum(per[spec.per] for spec in FIGURES.values()) == 10
    assert all(w > 300 and h > 150 and shown > 0 for w, h, shown in sizes), sizes


def test_clicking_a_header_sorts_its_table(page):
    before = column(page, "kernel-table", "tflops")
    page.click("#kernel-table th[data-key='tflops']")
    asc = column(page, "kernel-table", "tflops")
    numbers = [float(v) for v in asc if v]
    assert asc != before  # the rows were in cell order, not by throughput
    ok = rd.kernels_df()
    assert numbers == sorted(numbers) and len(numbers) == (ok["status"] == "ok").sum()
    assert all(v == "" for v in asc[len(numbers):])  # cells without a number last
    assert page.evaluate("document.querySelector(\"#kernel-table th[data-key='tflops']\")"
                         ".getAttribute('aria-sort')") == "ascending"
    page.click("#kernel-table th[data-key='tflops']")
    desc = [float(v) for v in column(page, "kernel-table", "tflops") if v]
    assert desc == sorted(numbers, reverse=True)
    # Text columns sort as text (digit runs by their number: 64x2 before 128x2).
    page.click("#kernel-table th[data-key='kernel']")
    kernels = column(page, "kernel-table", "kernel")
    assert kernels == sorted(kernels) and kernels[0] == "fast_kernel" and kernels[-1] == "slow_kernel"
    page.click("#cp-table th[data-key='cell_id']")
    assert column(page, "cp-table", "cell_id")[:3] == ["ring/causal/bfloat16_bwd_64x1", "ring/causal/bfloat16_bwd_64x2",
                                                      "ring/causal/bfloat16_bwd_64x4"]


def type_filter(page, table: str, text: str) -> str:
    """Clear the table's filter box, type ``text`` into it as a user does; the count line after."""
    box = f"document.querySelector(\"input[data-table='{table}']\")"
    page.evaluate(f"var i = {box}; i.value = ''; i.dispatchEvent(new Event('input')); i.focus()")
    page.send("Input.insertText", {"text": text})
    return page.evaluate(f"document.querySelector(\".filter-count[data-table='{table}']\").textContent")


def test_typing_in_a_filter_keeps_only_matching_rows(page):
    assert type_filter(page, "kernel-table", "status:oom") == "2 of 36 rows"
    assert column(page, "kernel-table", "status") == ["oom", "oom"]
    type_filter(page, "kernel-table", "seqlen>128 kernel:fast_kernel")
    assert sorted(column(page, "kernel-table", "cell_id")) == [
        f"fast_kernel/{m}/bfloat16_{d}_256" for m, d in
        (("causal", "bwd"), ("causal", "fwd"), ("sliding", "bwd"), ("sliding", "fwd"))]


def test_a_key_value_filter_matches_the_whole_value_and_words_match_anywhere(page):
    # `kernel:fast` is no kernel (as `kernel:sdpa` is not sdpa_math); the word alone is text search.
    assert type_filter(page, "kernel-table", "kernel:fast") == "0 of 36 rows"
    assert type_filter(page, "kernel-table", "fast") == "12 of 36 rows"
    assert set(column(page, "kernel-table", "kernel")) == {"fast_kernel"}
    assert type_filter(page, "kernel-table", "KERNEL:Fast_Kernel direction:bwd") == "6 of 36 rows"
    # A number column matches as a number (its raw value is 128.0), not as text (not 1280, not 12).
    assert type_filter(page, "kernel-table", "seqlen:128") == "12 of 36 rows"
    assert set(column(page, "kernel-table", "seqlen")) == {"128.0"}
    assert type_filter(page, "kernel-table", "seqlen:12") == "0 of 36 rows"
    assert type_filter(page, "cp-table", "strategy:ring cp_size:2") == "4 of 24 rows"
    assert type_filter(page, "failed-table", "status:oom") == "4 of 19 rows"  # 2 kernel cells, 2 CP cells


def test_filter_keys_are_the_keys_each_table_has_and_an_unknown_key_is_said(page):
    keys = page.evaluate("""Array.prototype.map.call(document.querySelectorAll('p.filter-keys'), function (p) {
        var t = document.getElementById(p.dataset.table);
        return [p.dataset.table,
                Array.prototype.map.call(p.querySelectorAll('code'), function (c) { return c.textContent; }),
                Array.prototype.map.call(t.tHead.rows[0].cells, function (th) { return th.dataset.key; })]; })""")
    assert [table for table, _, _ in keys] == ["kernel-table", "cp-table", "failed-table"]
    assert all(listed == header for _, listed, header in keys), keys
    hint = page.evaluate("document.querySelector(\"p.filter-keys[data-table='kernel-table']\").textContent")
    assert "tflops (TFLOPs/s)" in hint and "peak_mem_bytes (peak MiB)" in hint  # the key beside its header
    # A key the table does not have: said, and the term searched as text (here: no row has it).
    assert type_filter(page, "kernel-table", "TFLOPs/s>1") == "0 of 36 rows"
    assert type_filter(page, "kernel-table", "tflop>1") == "0 of 36 rows (no column tflop: matched as text)"
    assert type_filter(page, "kernel-table", "tflops>1") == "3 of 36 rows"


def test_an_answer_link_lands_on_its_row(page):
    href = page.evaluate("document.querySelector('#best-kernel-table a.winner').getAttribute('href')")
    page.click("#best-kernel-table a.winner")
    assert page.evaluate("location.hash") == href
    assert page.evaluate("document.querySelector(':target').tagName") == "TR"


def test_the_first_screen_is_the_answer_and_not_blank(page, tmp_path):
    png = page.screenshot()
    (tmp_path / "first_screen.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 50
    white = max(count for count, rgb in colors if rgb == (255, 255, 255)) if any(
        rgb == (255, 255, 255) for _, rgb in colors) else 0
    assert white < 0.97 * WIDTH * HEIGHT  # something is drawn
    # Both answers are within the first screen.
    for selector in ("#best-kernel-table", "#best-cp-table"):
        top, bottom = page.evaluate(f"(function () {{ var r = document.querySelector('{selector}')"
                                    ".getBoundingClientRect(); return [r.top, r.bottom]; }())")
        assert 0 <= top < bottom <= HEIGHT, (selector, top, bottom)
