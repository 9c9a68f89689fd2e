"""Context -> HTML (jinja2) -> PDF (weasyprint), written atomically.

Templates are looked up per file, first match wins:
  1. the user's folder (`report.templates` in the scenario, relative to the scenario file), for a company's layout;
  2. the repository's top-level templates/ (a source checkout or an editable install);
  3. the copy packaged inside nnmem_sweep (nnmem_sweep/templates/, listed in pyproject's package-data) so an
     installed CLI finds them.
One Environment is built per render (never a module global): autoescape on, StrictUndefined, formatters as filters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from ..errors import UsageError
from .format import FILTERS

MAIN_TEMPLATE = "report.html.j2"
_PKG = Path(__file__).resolve().parent.parent  # nnmem_sweep/


def shipped_template_dirs() -> list[Path]:
    candidates = [_PKG.parent / "templates", _PKG / "templates"]
    return [d for d in candidates if (d / MAIN_TEMPLATE).is_file()]


def make_environment(user_dir: Path | None = None) -> jinja2.Environment:
    dirs = [] if user_dir is None else [Path(user_dir)]
    dirs += shipped_template_dirs()
    if not dirs:
        raise UsageError("report templates not found: neither templates/ nor nnmem_sweep/templates/ holds "
                         f"{MAIN_TEMPLATE}")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FILTERS)
    return env


def render_html(context: dict[str, Any], user_dir: Path | None = None) -> str:
    env = make_environment(user_dir)
    try:
        return env.get_template(MAIN_TEMPLATE).render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise UsageError(f"{e.filename}:{e.lineno}: template error: {e.message}") from None
    except jinja2.UndefinedError as e:
        raise UsageError(f"report template uses a value the report does not provide: {e.message}") from None


def _no_fetch(url: str, timeout: int = 10, ssl_context: Any = None) -> dict:
    """weasyprint URL fetcher that refuses everything: the report must be self-contained."""
    raise ValueError(f"report.html must be self-contained; refusing to fetch {url}")


def render_pdf(html: str) -> bytes:
    import logging

    import weasyprint

    # weasyprint logs every CSS property it ignores; a reader of the CLI does not need them.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    return weasyprint.HTML(string=html, url_fetcher=_no_fetch).write_pdf()
