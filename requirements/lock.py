"""Write requirements/measure.lock from pip's resolution of '.[dev,measure]' with the pinned torch pair.

Usage (make lock): python3 requirements/lock.py REPORT.json > requirements/measure.lock, where REPORT.json is
`pip install --dry-run --ignore-installed --report REPORT.json -e '.[dev,measure]' TORCH` in an empty venv.

The lock holds every wheel of the measurement stack at its exact release and sha256, so `make test` installs it
without resolving and checks what it gets. Its lines are ordered by wheel size, largest first, so that the
Makefile's two pip processes (alternate lines) unpack about the same bytes each: the CUDA build of torch brings
nvidia wheels of 3.2 GiB installed, and pip unpacks one wheel at a time. Standard library only (it runs before any
install).
"""
from __future__ import annotations

import json
import os
import sys
from urllib.parse import unquote, urlparse


def _size(url: str) -> int:
    """Bytes of a wheel on this machine's disk (file:// indexes); 0 where pip fetched it over the network."""
    u = urlparse(url)
    path = unquote(u.path)
    return os.path.getsize(path) if u.scheme == "file" and os.path.isfile(path) else 0


def lines(report: dict) -> list[str]:
    rows = []
    for item in report["install"]:
        info = item["download_info"]
        if "dir_info" in info:  # the project itself (installed editable, apart)
            continue
        meta = item["metadata"]
        digest = info["archive_info"]["hashes"]["sha256"]
        rows.append((-_size(info["url"]), meta["name"].lower(),
                     f"{meta['name'].lower()}=={meta['version']} --hash=sha256:{digest}"))
    return [r[2] for r in sorted(rows)]


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    env = report["environment"]
    print("# The measurement stack of `make test`, exact releases (make lock writes it; pip check holds it to")
    print("# pyproject.toml). Resolved by pip " + report["pip_version"] + " for Python " + env["python_version"]
          + ", " + env["sys_platform"] + " " + env["platform_machine"] + "; elsewhere, or where an index lacks a")
    print("# release, make test falls back to pip's own resolution. Largest wheels first (see requirements/lock.py).")
    for line in lines(report):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
