"""Safe file names and atomic writes: outputs never leave --out, and a failed write leaves the old file intact."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout the package runs from: configs/, tests/, validation/
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def umask() -> int:
    """The process's umask (os.umask can only be read by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def safe_stem(name: str) -> str:
    """A file-name-safe version of `name`: no slashes, no '..', no leading dots; never empty."""
    stem = _UNSAFE.sub("-", name).strip("-.")
    stem = stem.replace("..", "-")
    return stem or "scenario"


def publish(tmp: str | Path, path: Path) -> None:
    """Rename the finished temporary file `tmp` over `path`, with the mode an ordinary open() would have given it
    (mkstemp creates 0600; 0666 less the umask)."""
    os.chmod(tmp, 0o666 & ~umask())
    os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write to a temporary file in the same folder, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        publish(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def user_cache_dir() -> Path:
    """nnmem_sweep's user cache: $NNMEM_SWEEP_CACHE, else $XDG_CACHE_HOME/nnmem_sweep, else ~/.cache/nnmem_sweep."""
    if os.environ.get("NNMEM_SWEEP_CACHE"):
        return Path(os.environ["NNMEM_SWEEP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nnmem_sweep"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 4 MiB blocks (a results.csv can be gigabytes)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def sources_digest(root: Path, pattern: str = "*.py") -> str:
    """sha256 over the Python sources under `root` (each file's path relative to it and its bytes, sorted): which
    code this is, without git (the GPU kit's code_sha256; the allocator model's, keying kept replays)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(Path(root).rglob(pattern)):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class NamedFileError(ValueError):
    """A file a scenario names that cannot be read, in one line."""


def read_named_file(path: Path, what: str) -> str:
    """The text of a file a scenario names (a DeepSpeed or accelerate config); NamedFileError where it cannot be
    read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise NamedFileError(f"cannot read the {what} {path}: {e.strerror or e}") from None
