"""Where a report comes from: the config's sha256, its git commit, uncommitted changes, the tool version, a date,
and the run id that every file of an output set carries (run.json, the HTML and the PDF).

The date is never read from the clock, so the same config at the same commit renders byte-identical HTML:
SOURCE_DATE_EPOCH when set (the reproducible-builds convention, https://reproducible-builds.org/specs/
source-date-epoch/), else the committer date of the config's last commit, else the file's modification time.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from . import __version__

_PACKAGE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Provenance:
    config_path: str  # as the user gave it
    sha256: str
    commit: str  # full hash of the last commit touching the config, "" when not in git
    dirty: bool  # the file differs from that commit, or git does not track it
    in_git: bool
    date: str  # YYYY-MM-DD, UTC
    date_source: str  # "SOURCE_DATE_EPOCH" | "config commit" | "file modification time"
    tool_version: str


def _git(args: list[str], cwd: Path) -> str | None:
    """Output of a git command run in `cwd`, or None when git or the repository is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _utc_date(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d")


def collect(config_path: str | Path, text: bytes | None = None) -> Provenance:
    path = Path(config_path)
    data = text if text is not None else path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    folder = path.resolve().parent
    name = path.resolve().name

    commit, commit_epoch, in_git, dirty = "", None, False, True
    inside = _git(["rev-parse", "--is-inside-work-tree"], folder)
    if inside == "true":
        tracked = _git(["ls-files", "--error-unmatch", "--", name], folder)
        if tracked:
            in_git = True
            log = _git(["log", "-1", "--format=%H %ct", "--", name], folder)
            if log:
                commit, epoch = log.split()
                commit_epoch = int(epoch)
            status = _git(["status", "--porcelain", "--", name], folder)
            dirty = bool(status) or not commit

    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env.isdigit():
        date, date_source = _utc_date(int(env)), "SOURCE_DATE_EPOCH"
    elif commit_epoch is not None:
        date, date_source = _utc_date(commit_epoch), "config commit"
    elif path.is_file():
        date, date_source = _utc_date(int(path.stat().st_mtime)), "file modification time"
    else:  # a scenario given as text (tests, the library): no file to date
        date, date_source = "", "no config file"

    return Provenance(str(config_path), sha, commit, dirty, in_git, date, date_source, __version__)


def run_id(config_sha256: str, files: Iterable[tuple[str, str]]) -> str:
    """The identity of an output set: the first 16 hex digits of sha256 over the config's sha256 and each data
    file's name and sha256, in name order ("<config sha256>\\n", then "<name> <sha256>\\n" per file).

    Derived from content, never from the clock: the same config and the same tables give the same id, so a
    re-render stays byte-identical, and any changed byte of a table gives another. A reviewer recomputes it from
    run.json (its `run_id_covers` names the files) and compares it with the one printed in the HTML and PDF."""
    h = hashlib.sha256(f"{config_sha256}\n".encode())
    for name, sha in sorted(files):
        h.update(f"{name} {sha}\n".encode())
    return h.hexdigest()[:16]


def tool_commit() -> tuple[str, bool] | None:
    """(commit, uncommitted changes under nnmem_sweep/) of the code running, when it runs from a git checkout."""
    head = _git(["rev-parse", "HEAD"], _PACKAGE)
    if not head or not _git(["ls-files", "--error-unmatch", "--", "__init__.py"], _PACKAGE):
        return None  # not a checkout, or an installed copy that merely lies inside some repository
    status = _git(["status", "--porcelain", "--", "."], _PACKAGE)
    return head, bool(status)
