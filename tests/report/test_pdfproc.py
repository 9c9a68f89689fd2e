"""report.pdf from the child process (report/pdfproc.py): the very bytes an in-process render gives; a child that
died is one clear error, not a hang or a half-written PDF."""
from __future__ import annotations

import pytest

from nnmem_sweep.report.pdfproc import PdfProcess
from nnmem_sweep.report.render import render_pdf

HTML = ('<html><head><style>html { font-family: "DejaVu Sans" } code { font-family: "DejaVu Sans Mono" }</style>'
        '</head><body><h1>Report</h1><p>peak <b>22.4 GiB</b> on <code>h100-sxm</code></p><table><tr><td>1</td>'
        '<td>2</td></tr></table><svg width="40" height="20"><rect width="30" height="10"/><text x="2" y="18">x</text>'
        '</svg></body></html>')


def test_the_child_renders_the_same_bytes_as_this_process(monkeypatch):
    # fontTools stamps the subset fonts with the time unless SOURCE_DATE_EPOCH is set: then a PDF is reproducible
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    with PdfProcess() as child:
        pdf = child.render(HTML)
    assert pdf.startswith(b"%PDF-") and pdf == render_pdf(HTML)


def test_a_child_that_died_is_one_line_of_error():
    with PdfProcess() as child:
        child.proc.kill()
        child.proc.wait()
        with pytest.raises(RuntimeError, match=r"^rendering report.pdf failed: exit code -9$"):
            child.render(HTML)
