"""report.pdf rendered by a child process that make_report starts first thing, so that weasyprint's import and its
first-use set-up (pango, fontconfig, the user-agent stylesheet: ~1 s of CPU) run on a second core while this
process loads the scenario, runs the grid and builds the HTML. The child renders with render.render_pdf, as an
in-process render would, the same bytes: it reads the HTML on stdin and writes the PDF on stdout.

The parent decides when to stop: the child ignores SIGINT (a Ctrl-C reaches the whole process group) and the
parent kills it on any failure or signal of its own (`close`), before the output set removes its staging folder.
If the parent dies, the child reads end-of-file and exits without rendering.

    python -m nnmem_sweep.report.pdfproc      (what PdfProcess starts; stdin HTML, stdout PDF)
"""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this nnmem_sweep: the child imports the same code
# the report's fonts, a bold run, monospace and an SVG text: what the first real render would set up
WARM_UP = ('<html><head><style>html { font-family: "DejaVu Sans", sans-serif } code { font-family: "DejaVu Sans Mono",'
           ' monospace }</style></head><body><p>x <b>y</b> <code>z</code></p><svg width="10" height="10"><text x="1" '
           'y="5">a</text></svg></body></html>')


class PdfProcess:
    """The child: started at construction, `render(html) -> bytes` once, `close()` always (a context manager)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH"))
                                                           if p)}
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "nnmem_sweep.report.pdfproc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env)
        except OSError:  # no interpreter to start (an embedded Python): render in this process, only slower
            self.proc = None

    def render(self, html: str) -> bytes:
        if self.proc is None:
            from .render import render_pdf

            return render_pdf(html)
        pdf, err = self.proc.communicate(html.encode("utf-8"))
        if self.proc.returncode != 0 or not pdf.startswith(b"%PDF-"):
            lines = err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {self.proc.returncode}"]
            raise RuntimeError(f"rendering report.pdf failed: {lines[-1]}")
        return pdf

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> "PdfProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:  # pragma: no cover - runs in the child (tests/test_output_sets.py, tests/report)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No cyclic garbage collection: weasyprint builds hundreds of thousands of boxes and styles, and the collector's
    # passes over them took 0.5 s of a 4.2 s render (llama report: 3.6 s without them, 7 MB more memory). The
    # process renders one document and exits.
    gc.disable()
    from .render import render_pdf

    render_pdf(WARM_UP)
    html = sys.stdin.buffer.read()
    if not html:  # the parent went away before sending the HTML
        os._exit(1)
    sys.stdout.buffer.write(render_pdf(html.decode("utf-8")))
    sys.stdout.buffer.flush()
    os._exit(0)  # no interpreter teardown (see cli.entry)


if __name__ == "__main__":  # pragma: no cover
    main()
