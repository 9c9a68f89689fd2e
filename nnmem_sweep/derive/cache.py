"""Derived plans and model cards on disk: derived once, read instantly afterwards.

Lookup, in order:
  1. the user's cache ($NNMEM_SWEEP_CACHE, else $XDG_CACHE_HOME/nnmem_sweep, else ~/.cache/nnmem_sweep), keyed by
     the sha256 of the model source, what is derived (card, or mode + recipe + attention + checkpointing + device),
     the installed torch / transformers / peft / torchvision versions and this module's FORMAT;
  2. plans shipped with nnmem_sweep (models/derived/), derived for the shipped presets by `make derive`: used
     whatever is installed (torch is not needed to read them); each names the versions it was derived with;
  3. derive it now (needs torch and transformers: the `measure` extra) and store it in the user's cache.
NNMEM_SWEEP_REDERIVE=1 skips 1 and 2.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from ..paths import user_cache_dir

FORMAT = 2  # bump when a derivation's rules change: plans of an older format are derived again
SHIPPED = Path(__file__).resolve().parent.parent / "models" / "derived"


STACK_PACKAGES = ("torch", "transformers", "peft", "torchvision")
_USED: dict[str, set[tuple]] = {}  # source digest -> the derived_with of the documents lookup() handed out here


@functools.cache
def installed(pkg: str) -> str | None:
    """The release of `pkg` this process imports (the first on its path), or None; read once per process (a report
    looked the stack up 700 times, 1.1 s of importlib.metadata)."""
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {pkg: installed(pkg) for pkg in STACK_PACKAGES}


def _name(what: tuple) -> str:
    return "-".join(str(x) for x in what)


def key(source_digest: str, what: tuple, vers: dict[str, str | None]) -> str:
    text = json.dumps({"format": FORMAT, "source": source_digest, "what": list(what), "versions": vers},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(source_digest: str, what: tuple, make: Callable[[], dict[str, Any]],
           ship_to: Path | None = None) -> dict[str, Any]:
    """The stored document for (source, what), or make() it and store it. Documents are JSON dicts; each gets a
    "derived_with" entry (the versions, the format). ship_to: also write it there as a shipped plan."""
    vers = versions()
    path = user_cache_dir() / f"{key(source_digest, what, vers)}.json"
    doc = None
    if not _rederive(path):
        for candidate in (path, shipped_path(source_digest, what)):
            found = _read(candidate)
            if found is not None and found.get("derived_with", {}).get("format") == FORMAT:
                doc = found
                break
    if doc is None:
        doc = make()
        # a document traced in a side environment (side.py) carries the releases it was traced with
        doc["derived_with"] = {"format": FORMAT, **vers, **doc.pop("_traced_with", {})}
        _write(path, doc)
        _REDERIVED.add(path)
    _USED.setdefault(source_digest, set()).add(tuple(sorted((k, str(v)) for k, v in doc["derived_with"].items()
                                                            if k in STACK_PACKAGES and v)))
    if ship_to is not None:
        ship(source_digest, what, doc, ship_to)
    return doc


# the documents made anew in this process: NNMEM_SWEEP_REDERIVE=1 derives each once per process, not at every lookup
# (`make derive` looked one plan up several times while deriving a scenario, and traced it again each time)
_REDERIVED: set[Path] = set()


def _rederive(path: Path) -> bool:
    """Whether the document at `path` is to be made anew: NNMEM_SWEEP_REDERIVE=1 and not yet in this process."""
    return os.environ.get("NNMEM_SWEEP_REDERIVE") == "1" and path not in _REDERIVED


def stack_text(derived_with: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """The releases a document was derived with, in words: "torch 2.14.1, transformers 5.24.0, peft 0.21.2" (a
    package it does not name is left out: plans shipped before peft was recorded do not name it)."""
    return ", ".join(f"{pkg} {derived_with[pkg].split('+')[0]}" for pkg in STACK_PACKAGES
                     if derived_with.get(pkg) and pkg not in skip)


def stacks_used(source_digests, skip: tuple[str, ...] = ()) -> list[str]:  # noqa: ANN001
    """The stacks of the plans and cards of these sources that lookup() handed out in this process, sorted
    (`skip`: packages the model does not use, e.g. torchvision for a transformers model)."""
    found = set().union(*(_USED.get(d, set()) for d in source_digests))
    return sorted({stack_text(dict(v), skip) for v in found})


def stored(source_digest: str, what: tuple) -> bool:
    """Whether lookup() would find the document without deriving it."""
    path = user_cache_dir() / f"{key(source_digest, what, versions())}.json"
    if _rederive(path):
        return False
    return any(d is not None and d.get("derived_with", {}).get("format") == FORMAT
               for d in (_read(path), _read(shipped_path(source_digest, what))))


def shipped_path(source_digest: str, what: tuple, root: Path = SHIPPED) -> Path:
    return root / source_digest[:16] / f"{_name(what)}.json.gz"


def ship(source_digest: str, what: tuple, doc: dict[str, Any], root: Path = SHIPPED) -> Path:
    """Write a document where lookup() finds shipped plans (`nnmem-sweep derive --ship`, `make derive`): gzip,
    with a fixed mtime, so the same plan is the same bytes."""
    path = shipped_path(source_digest, what, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, mtime=0))
    return path


def memo(kind: str, key_text: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A small computed document kept in the user's cache under `kind`, keyed by the sha256 of `key_text` (which
    must name everything the result depends on); make() it when absent. NNMEM_SWEEP_REDERIVE=1 recomputes."""
    found = memo_read(kind, key_text)
    if found is not None:
        return found
    doc = make()
    memo_write(kind, key_text, doc)
    return doc


def _memo_path(kind: str, key_text: str) -> Path:
    return user_cache_dir() / kind / f"{hashlib.sha256(key_text.encode()).hexdigest()}.json"


def memo_read(kind: str, key_text: str) -> dict[str, Any] | None:
    """memo's document if it is kept, else None (always None under NNMEM_SWEEP_REDERIVE=1)."""
    return None if os.environ.get("NNMEM_SWEEP_REDERIVE") == "1" else _read(_memo_path(kind, key_text))


def memo_write(kind: str, key_text: str, doc: dict[str, Any]) -> None:
    _write(_memo_path(kind, key_text), doc)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError, EOFError):
        return None


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Atomically (a half-written cache file would be read as a plan): a temporary file, then a rename. A cache
    that cannot be written is not an error: the plan is used anyway, and derived again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
