"""An output folder is always one consistent set: every file in it comes from the same run.

Every command that writes a folder (`run`, `run --stream`, `report`, `measure`) writes through `OutputSet`:

    with OutputSet(out, sc, command="report") as s:
        with s.open("results.csv") as f: ...      # files are hashed as they are written
        s.run_id()                                # the set's id, over the tables written so far
        render_report(result, s.folder, ...)      # or any code that writes into s.folder
    s.paths                                       # the files, now in `out`; run.json last

- Lock: `<parent>/.<name>.lock`, an flock(2) held from the start of the run to its end. A second run into the same
  folder refuses at once (OutputBusy: one line naming the holder's pid, exit 2) rather than waiting: a run takes
  seconds, and a queue of waiting CI jobs would hide a mistake in the job layout. The kernel drops the lock when
  its process ends, however it ends, so no stale lock can block the next run; the holder deletes the file when it
  is done (a run that locks a file re-checks that it is still the file at that path, so the deletion never lets
  two runs in).
- What may be replaced: an absent or empty folder, a set nnmem-sweep wrote (run.json lists every entry), or a folder
  holding only output files of the versions before run.json (their known names). Anything else, such as a user's
  notes, is refused (OutputRefused: one line naming the foreign entries, exit 2) before anything runs; nothing is
  ever deleted that nnmem-sweep did not write.
- Staging: the set is written into `<parent>/.<name>.new-XXXXXXXX` (same filesystem as `out`), run.json last.
- Commit: the staging folder and `out` are exchanged in one step, renameat2(RENAME_EXCHANGE) (Linux >= 3.15): a
  reader of `out` sees the whole old set or the whole new set, never a mix and never a missing folder; then the old
  set, now at the staging path, is removed. Where the exchange is missing (macOS, some network filesystems) it is
  two renames, out -> `.<name>.old-XXXXXXXX` then staging -> out: a reader may find no folder for the
  microseconds between them, never a mix. SIGINT and SIGTERM are held back during the swap and the removal, so
  only SIGKILL or a power cut can land between the two renames; the next run into the folder then puts the old
  set back before anything else, and removes any staging folder such a crash left.
- Failure (an exception, SIGINT, SIGTERM, which the CLI turns into an exception): the staging folder is removed,
  `out` was never touched, and the exception carries a note (PEP 678) saying what the folder holds.

The set's run id (provenance.run_id) is derived from the config's sha256 and the tables' sha256, so the same
config and numbers give the same id and the report renders byte-identical; it is printed in the HTML and PDF and
recorded in run.json with the config path, its sha256 and commit, the tool's version and commit, the start and end
time (UTC) and every file's size and sha256.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from glob import escape as glob_escape
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from . import __version__
from .errors import NnmemError
from .paths import file_sha256
from .paths import umask
from .testhook import PAUSE_ENV, RESUME_ENV, checkpoint  # noqa: F401  (the stages below; tests import them here)
from .provenance import Provenance, collect, run_id, tool_commit
from .tablefile import extension, write_table

RUN_JSON = "run.json"
TOOL = "nnmem-sweep"
# What the versions before run.json wrote into an output folder: such a folder may be replaced too.
LEGACY_FILES = frozenset({"results.csv", "max_batch.csv", "max_concurrency.csv", "max_context.csv",
                          "cluster_options.csv", "report.html", "report.pdf", "measured.csv"})
# What a file browser leaves in any folder it shows: replaced with the rest, never a reason to refuse.
LITTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class OutputBusy(NnmemError):
    """Another run holds the output folder's lock."""


class OutputRefused(NnmemError):
    """The output folder holds files nnmem-sweep did not write, or is not a folder."""


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then act as they would have (in the main thread only:
    Python runs signal handlers there and nowhere else)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in _HELD_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        if pending:
            signal.raise_signal(pending[0])


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


class _HashedFile:
    """A binary file that hashes and counts what is written to it (so a 200 MB CSV is not read back)."""

    def __init__(self, path: Path):
        self.raw = open(path, "wb")
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += len(view)
        return self.raw.write(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> "_HashedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_run_json(folder: Path) -> dict | None:
    """A folder's run.json when nnmem-sweep wrote it, else None."""
    try:
        data = json.loads((Path(folder) / RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("tool") == TOOL else None


def _leftover_temps(folder: Path, name: str) -> list[str]:
    """The middle and end of `.NAME.XXXXXXXX.tmp` files the per-file atomic writes of earlier versions left when
    killed (paths.atomic_write_bytes)."""
    return [p.name[len(name) + 2:] for p in folder.glob(f".{glob_escape(name)}.*.tmp")]


class _Lock:
    """flock(2) on `path`, taken without waiting; the file is removed on release (see the module docstring)."""

    def __init__(self, path: Path, folder: Path):
        self.path = path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode("ascii", "replace").strip()
                os.close(fd)
                by = f"pid {holder}" if holder.isdigit() else "another process"
                raise OutputBusy(f"{folder} is being written by another nnmem-sweep run ({by}; lock {path}); "
                                 "nothing written: run again when it has finished, or choose another --out") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)


class OutputSet:
    """The files of one run, staged beside `out` and put in its place in one step (see the module docstring).

    `sc` (a Scenario) or `config_path` names the config recorded in run.json; `command` is the CLI command."""

    def __init__(self, out: str | Path, sc: Any = None, *, command: str, config_path: str | Path | None = None):
        out = Path(out)
        if out.is_symlink():  # a link to a folder: replace the folder it names, keep the link
            out = out.resolve()
        elif out.name in ("", ".", ".."):  # "." or "x/..": the folder's own name is needed for what goes beside it
            out = Path(os.path.abspath(out))
        self.out = out
        self.command = command
        self.config_path = config_path if config_path is not None else getattr(sc, "path", None)
        self._text = getattr(sc, "source_text", None)
        self.folder: Path | None = None  # the staging folder while the run lasts
        self.paths: list[Path] = []  # after the commit: the files in `out`, run.json last
        self.committed = False
        self._written: list[tuple[str, _HashedFile]] = []
        self._run_id: str | None = None
        self._covers: list[str] = []
        self._created: list[Path] = []
        self._lock: _Lock | None = None
        self.provenance: Provenance | None = None
        self.previous: str = ""

    # ------------------------------------------------------------------ entering: lock, check, stage
    def __enter__(self) -> "OutputSet":
        self.started = time.time()
        parent = self.out.parent
        for p in [parent, *parent.parents]:
            if p.exists():
                if not p.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(p))
                break
            self._created.append(p)
        parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = _Lock(parent / f".{self.out.name}.lock", self.out)
            self._recover()
            self.previous = self._check_replaceable()
            self.provenance = self._provenance()
            self.folder = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.new-", dir=parent))
            checkpoint("staged")
        except BaseException as e:
            self._abort(e)
            raise
        return self

    def _provenance(self) -> Provenance | None:
        if not self.config_path:
            return None
        path = Path(self.config_path)
        text = None if path.is_file() else (self._text or "").encode("utf-8")
        return collect(self.config_path, text)

    def _leftovers(self, kind: str) -> list[Path]:
        return sorted(p for p in self.out.parent.glob(f".{glob_escape(self.out.name)}.{kind}-*") if p.is_dir())

    def _recover(self) -> None:
        """Undo what a SIGKILL or a power cut left (we hold the lock, so no live run owns these): a previous set
        moved aside goes back when `out` is missing, and every staging folder goes."""
        olds = self._leftovers("old")
        if olds and not os.path.lexists(self.out):
            os.rename(olds.pop(), self.out)
        for p in olds + self._leftovers("new"):
            shutil.rmtree(p, ignore_errors=True)

    def _check_replaceable(self) -> str:
        """Refuse a folder that holds what nnmem-sweep did not write; describe what it holds now."""
        out = self.out
        if not os.path.lexists(out):
            return f"nothing was written to {out}"
        if not out.is_dir():
            raise OutputRefused(f"--out {out} is a file, not a folder; nothing written")
        entries = sorted(os.listdir(out))
        if not entries:
            return f"nothing was written to {out}"
        meta = read_run_json(out)
        ours = LEGACY_FILES
        if meta:
            ours = {f.get("name") for f in meta.get("files", ()) if isinstance(f, dict)} | {RUN_JSON}
        ours = ours | LITTER | {f".{name}.{tmp}" for name in ours for tmp in _leftover_temps(out, name)}
        foreign = [e + ("/" if (out / e).is_dir() else "") for e in entries
                   if e not in ours or not (out / e).is_file()]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputRefused(f"refusing to replace {out}: it holds {shown}, which no nnmem-sweep run wrote "
                                "there; move them elsewhere or choose another --out (nothing written)")
        if meta:
            return (f"{out} is unchanged: it holds the previous complete set (run {meta.get('run_id')}, "
                    f"finished {meta.get('finished_utc')})")
        return f"{out} is unchanged: it holds the files of the previous run"

    # ------------------------------------------------------------------ writing
    def path(self, name: str) -> Path:
        if self.folder is None:
            raise RuntimeError("OutputSet used outside its with-block")
        if name != Path(name).name or name in ("", ".", "..", RUN_JSON):
            raise ValueError(f"not a plain output file name: {name!r}")
        return self.folder / name

    def open(self, name: str) -> _HashedFile:
        """A new file of the set, hashed as it is written."""
        f = _HashedFile(self.path(name))
        self._written.append((name, f))
        return f

    def write_bytes(self, name: str, data: bytes) -> Path:
        with self.open(name) as f:
            f.write(data)
        return self.path(name)

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_tables(self, tables, fmt: str = "csv") -> None:  # noqa: ANN001 - [(CSV file name, DataFrame)]
        """A run's tables (runner.output_tables): results and max_batch as `fmt` (csv or parquet), the plans always
        as CSV (a few rows each), every one through tablefile's one writer."""
        for name, frame in tables:
            own = fmt if name in ("results.csv", "max_batch.csv") else "csv"
            with self.open(name.removesuffix(".csv") + extension(own)) as f:
                write_table(frame, f, own)

    def _files(self) -> dict[str, tuple[str, int]]:
        """sha256 and size of every file in the staging folder: from the writer where it hashed them, else read."""
        known = {name: (f.sha.hexdigest(), f.size) for name, f in self._written if f.closed}
        out = {}
        for name in sorted(os.listdir(self.folder)):
            p = self.folder / name
            if not p.is_file() or name == RUN_JSON:
                raise RuntimeError(f"unexpected entry {name!r} in the staging folder")
            size = p.stat().st_size
            out[name] = known[name] if name in known and known[name][1] == size else (file_sha256(p), size)
        return out

    def run_id(self) -> str:
        """The set's id over the config and the files written so far (the tables); fixed at its first call, so
        the HTML and PDF written after it carry it too."""
        if self._run_id is None:
            files = self._files()
            self._covers = sorted(files)
            sha = self.provenance.sha256 if self.provenance else ""
            self._run_id = run_id(sha, ((n, files[n][0]) for n in self._covers))
        return self._run_id

    def _run_json(self, files: dict[str, tuple[str, int]]) -> dict:
        prov = self.provenance
        tool = tool_commit()
        return {
            "tool": TOOL, "tool_version": __version__,
            "tool_commit": tool[0] if tool else None, "tool_uncommitted_changes": tool[1] if tool else None,
            "command": self.command, "run_id": self.run_id(), "run_id_covers": self._covers,
            "config": None if prov is None else {"path": prov.config_path, "sha256": prov.sha256,
                                                 "commit": prov.commit or None, "uncommitted_changes": prov.dirty},
            "started_utc": _utc(self.started), "finished_utc": _utc(time.time()),
            "files": [{"name": n, "bytes": size, "sha256": sha} for n, (sha, size) in files.items()],
        }

    # ------------------------------------------------------------------ leaving: commit or clean up
    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            try:
                self._commit()
            except BaseException as e:
                self._abort(e)
                raise
            return
        self._abort(exc)

    def _commit(self) -> None:
        files = self._files()
        (self.folder / RUN_JSON).write_text(json.dumps(self._run_json(files), indent=1) + "\n", encoding="utf-8")
        checkpoint("commit")
        mode = stat.S_IMODE(self.out.stat().st_mode) if self.out.is_dir() else 0o777 & ~umask()
        os.chmod(self.folder, mode)  # mkdtemp made it 0700
        with signals_held():
            if not os.path.lexists(self.out):
                os.rename(self.folder, self.out)
                old = None
            elif _exchange(self.folder, self.out):
                old = self.folder
            else:
                old = self.out.parent / f".{self.out.name}.old-{self.folder.name.rsplit('.new-', 1)[1]}"
                os.rename(self.out, old)
                os.rename(self.folder, self.out)
            self.committed = True
            self.folder = None
            order = [n for n, _ in self._written if n in files] + [n for n in files if n not in dict(self._written)]
            self.paths = [self.out / n for n in order] + [self.out / RUN_JSON]  # in the order they were written
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            self._release()

    def _abort(self, exc: BaseException) -> None:
        self._clean_up()
        if self.outcome():  # empty when refused before the folder was looked at (OutputBusy says why itself)
            exc.add_note(self.outcome())

    def _clean_up(self) -> None:
        """Remove the staging folder, release the lock, and remove the folders this run made for --out (if empty)."""
        with signals_held():
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None
            self._release()
            if not self.committed:
                for p in self._created:  # innermost first
                    try:
                        p.rmdir()
                    except OSError:
                        break

    def outcome(self) -> str:
        """One sentence: what the output folder holds now."""
        if self.committed:
            return f"{self.out} holds this run's complete set (run {self._run_id})"
        return self.previous

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
