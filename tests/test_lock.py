"""The measurement stack's lock (requirements/measure.lock), which `make test` installs without resolving: it must
pin every requirement of pyproject.toml within its range, the Makefile's torch pair exactly, each with its sha256,
and keep the largest wheels first (the Makefile's two pip processes take alternate lines)."""
from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "measure.lock"


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9._-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        assert m, f"not a pinned, hashed lock line: {line!r}"
        name = canonicalize_name(m[1])
        assert name not in pins, f"{name} pinned twice"
        pins[name] = m[2]
    return pins


def test_the_lock_pins_every_requirement_of_the_project_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]
            + project["optional-dependencies"]["measure"]]
    pins = _pins()
    assert len(reqs) >= 15
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in {LOCK.name}: make lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}: make lock"


def test_the_lock_holds_the_makefiles_torch_pair():
    torch = re.search(r"^TORCH\s*\?=\s*(.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)[1].split()
    pins = _pins()
    for spec in torch:
        name, version = spec.split("==")
        assert pins[canonicalize_name(name)] == version


def _writer():
    spec = importlib.util.spec_from_file_location("lock_writer", ROOT / "requirements" / "lock.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_writer_puts_the_largest_wheels_first_and_leaves_the_project_out(tmp_path):
    wheels = {"small": 10, "Big_One": 3000, "middle": 200}
    items = []
    for name, size in wheels.items():
        path = tmp_path / f"{name}-1.0-py3-none-any.whl"
        path.write_bytes(b"x" * size)
        items.append({"metadata": {"name": name, "version": "1.0"},
                      "download_info": {"url": path.as_uri(), "archive_info": {"hashes": {"sha256": name[0] * 64}}}})
    items.append({"metadata": {"name": "nnmem_sweep", "version": "0.1.0"},
                  "download_info": {"url": ROOT.as_uri(), "dir_info": {"editable": True}}})
    # a wheel fetched over the network has no size here: after those on disk, by name
    items.append({"metadata": {"name": "aaa", "version": "2.0"},
                  "download_info": {"url": "https://example.org/aaa-2.0-py3-none-any.whl",
                                    "archive_info": {"hashes": {"sha256": "a" * 64}}}})
    lines = _writer().lines({"install": items})
    assert lines == ["big_one==1.0 --hash=sha256:" + "B" * 64, "middle==1.0 --hash=sha256:" + "m" * 64,
                     "small==1.0 --hash=sha256:" + "s" * 64, "aaa==2.0 --hash=sha256:" + "a" * 64]


def test_the_committed_lock_keeps_the_largest_wheels_first():
    """Where the locked wheels lie on this machine's disk (its package indexes), their sizes never grow down the
    lock, so alternate lines share the bytes about evenly; those pip fetched over the network come last."""
    wheels = [p for d in ("/opt/pypi/files", "/opt/pypi-more/files") if Path(d).is_dir() for p in Path(d).glob("*.whl")]
    sizes = []
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        name, version = line.split(" ")[0].split("==")
        found = [p for p in wheels if p.name.split("-")[1] == version
                 and canonicalize_name(p.name.split("-")[0]) == canonicalize_name(name)]
        sizes.append(found[0].stat().st_size if found else 0)  # fetched over the network: last, as the writer does
    if not any(sizes):
        pytest.skip("the locked wheels do not lie on this machine's disk")
    assert len(sizes) > 50 and sizes == sorted(sizes, reverse=True)
