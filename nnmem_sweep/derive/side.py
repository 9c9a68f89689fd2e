"""Plans of the releases a team pins (issue 21, item 1): the model's code of another transformers / peft, traced in a
side environment.

A scenario's `runtime: {transformers: "5.17.0", peft: "0.21.0"}` names releases; where they are not the installed
ones, the model's card and plans are traced by a child Python whose import path puts a side environment first:

    <user cache>/stacks/transformers-5.17.0[-peft-0.21.0]/     pip install --target, --no-deps

It holds only those packages; everything else (torch above all: never a second multi-GB copy) is the installed
environment's. `nnmem-sweep stack --transformers 5.17.0 [--peft 0.21.0]` prepares it once (pip, from the network or
the machine's own package index); running offline without it is one line naming that command. The child traces
exactly what the in-process path traces (derive.derivation, card, kvcache) and hands back the document with the
releases it really imported, which the plan then carries (results.csv plan_stack, the report's first page).

Run as `python -m nnmem_sweep.derive.side` it is that child: a JSON request on stdin, the document on stdout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from ..paths import user_cache_dir
from .cache import installed, versions
from .source import DerivationError, ModelSource

PACKAGES = ("transformers", "peft")  # the runtime: keys naming the releases of the model's own code
READY = "READY"  # written last into a prepared environment: a folder without it is an interrupted install
_RELEASE = re.compile(r"\d+\.\d+\.\d+[a-z0-9.]*")


def stack_of(desc: dict[str, Any] | None) -> dict[str, str]:
    """{transformers: "5.17.0", peft: ...} of a `runtime:` block (only the keys it states); a malformed release
    raises ValueError naming the key."""
    out = {}
    for key in PACKAGES:
        v = (desc or {}).get(key)
        if v is None:
            continue
        if not isinstance(v, str) or not _RELEASE.fullmatch(v):
            raise ValueError(f"runtime.{key}: expected a release such as '5.17.0' (quoted), got {v!r}")
        out[key] = v
    return out


SIDE_ENV = "NNMEM_SWEEP_SIDE_STACK"  # set by child_env: the releases a child Python was started with


def stated(runtime: Any) -> dict[str, str]:
    """The releases a `runtime:` block names that are not the installed ones ({} for none, or a malformed block:
    parse_runtime reports that). In a child Python started for such releases (child_env: measure's child, which
    imports them), the ones it was started for count as stated still, so the child plans the scenario as its parent
    does (a hand-modelled family from that release's code), not with the hand model."""
    try:
        stack = stack_of(runtime if isinstance(runtime, dict) else {})
    except ValueError:
        return {}
    here = differing(stack)
    if here:
        return here
    try:
        started = json.loads(os.environ.get(SIDE_ENV) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in sorted(stack.items()) if k in PACKAGES and started.get(k) == v} \
        if isinstance(started, dict) else {}


class NotPrepared(DerivationError):
    """The stated releases have no side environment yet (one line naming the command that prepares it)."""


def differing(stack: dict[str, str]) -> dict[str, str]:
    """The stated releases that are not the installed ones ({} where the installed environment is that stack)."""
    return {k: v for k, v in sorted(stack.items()) if k in PACKAGES and installed(k) != v}


def folder(stack: dict[str, str]) -> Path:
    name = "-".join(f"{k}-{stack[k]}" for k in PACKAGES if k in stack)
    return user_cache_dir() / "stacks" / name


def describe(stack: dict[str, str]) -> str:
    """"transformers 5.17.0, peft 0.21.0"."""
    return ", ".join(f"{k} {v}" for k, v in stack.items())


def child_env(where: Path, stack: dict[str, str]) -> dict[str, str]:
    """This process's environment with the side folder `where` of `stack` first on the import path (a child Python),
    and the stack named in SIDE_ENV (stated())."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), *filter(None, [os.environ.get("PYTHONPATH")])]),
                **{SIDE_ENV: json.dumps(stack, sort_keys=True)})


def command(stack: dict[str, str]) -> str:
    """The command that prepares the environment of `stack`, as the user types it."""
    return "nnmem-sweep stack " + " ".join(f"--{k} {stack[k]}" for k in PACKAGES if k in stack)


def ready(stack: dict[str, str]) -> Path:
    """The prepared folder of `stack`, or a one-line DerivationError naming the command that prepares it."""
    where = folder(stack)
    if not (where / READY).is_file():
        raise NotPrepared(f"the model's code of {describe(stack)} is not prepared beside the user cache ({where}); "
                          f"prepare it once with: {command(stack)}")
    return where


def prepared() -> list[tuple[dict[str, str], Path, int]]:
    """(stack, folder, bytes on disk) of every prepared side environment, by folder name."""
    root = user_cache_dir() / "stacks"
    out = []
    for where in sorted(root.glob("*")) if root.is_dir() else []:
        try:
            stack = json.loads((where / READY).read_text())
        except (OSError, ValueError):
            continue  # an interrupted install: not ready, prepare() replaces it
        out.append((stack, where, sum(f.stat().st_size for f in where.rglob("*") if f.is_file())))
    return out


def prepare(stack: dict[str, str], pip_args: tuple[str, ...] = (), say=print) -> Path:  # noqa: ANN001
    """pip install --target the stated releases into a fresh folder (transformers with the dependencies the
    installed environment does not satisfy, peft alone), then move it into place (an interrupted install leaves
    nothing half-made); returns the folder. pip's own error ends in a DerivationError."""
    where = folder(stack)
    if (where / READY).is_file():
        say(f"{where}: ready")
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=where.name + ".", dir=where.parent))
    try:
        # transformers with its own dependencies (it needs no torch), peft without (it would pull torch): then
        # every dependency the installed environment already satisfies is taken out again, so the side folder
        # shadows only what that release needs otherwise (numpy and the rest stay the installed ones)
        if "transformers" in stack:
            _pip(tmp, pip_args, [f"transformers=={stack['transformers']}"], say)
        if "peft" in stack:
            _pip(tmp, pip_args, ["--no-deps", f"peft=={stack['peft']}"], say)
        _drop_satisfied(tmp, [p for p in PACKAGES if p in stack])
        (tmp / READY).write_text(json.dumps(stack, sort_keys=True) + "\n")
        if where.exists():
            shutil.rmtree(where)
        tmp.rename(where)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{where}: ready")
    return where


def _pip(target: Path, pip_args: tuple[str, ...], reqs: list[str], say) -> None:  # noqa: ANN001
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(target), *pip_args, *reqs]
    say("running: " + " ".join(cmd[2:]))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise DerivationError(f"pip could not install {' '.join(reqs)}: {last[-1] if last else 'no output'}")


def _drop_satisfied(target: Path, keep: list[str]) -> None:
    """Remove from `target` every distribution (but the kept packages) that the installed environment already has
    at a release satisfying what the target's distributions require of it: its files and dist-info. What stays
    is what the kept releases need otherwise (huggingface_hub 1.x for transformers 5.17, say); torch's own
    dependencies (numpy, typing_extensions, filelock, ...) stay the installed ones wherever they can."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(target)])}
    wants: dict[str, list] = {}
    for d in dists.values():
        for text in d.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                wants.setdefault(canonicalize_name(req.name), []).append(req.specifier)
    keep_names = {canonicalize_name(k) for k in keep}
    for name, d in dists.items():
        have = installed(name)
        if name in keep_names or have is None or not all(sp.contains(have, True) for sp in wants.get(name, [])):
            continue
        for f in d.files or []:
            path = Path(d.locate_file(f))
            if path.is_file():
                path.unlink()
        for info in target.glob("*.dist-info"):
            if canonicalize_name(info.name.split("-")[0]) == name:
                shutil.rmtree(info, ignore_errors=True)
    for d in sorted((p for p in target.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if d.name == "__pycache__" or not any(d.iterdir()):  # left behind by the files taken out
            shutil.rmtree(d, ignore_errors=True)


def traced(source: ModelSource, what: tuple, progress: bool = False) -> dict[str, Any]:
    """The document (card, plan or KV layout) of `what` for `source`, traced by a child Python with the side
    environment of source.stack first on its path; the releases it imported under "_traced_with"."""
    stack = differing(source.stack)
    where = ready(stack)
    request = {"source": {"kind": source.kind, "spec": source.spec, "origin": source.origin,
                          "decoder_seq_len": source.decoder_seq_len, "finetune": source.finetune,
                          "preference": source.preference, "fsdp": source.fsdp},
               "what": list(what), "progress": progress, "stack": stack, "in_worker": bool(_in_worker())}
    child = subprocess.Popen([sys.executable, "-m", "nnmem_sweep.derive.side"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True,
                             env=child_env(where, stack))
    try:
        out, err = child.communicate(json.dumps(request))
    except BaseException:  # a signal or an error here: the child goes too
        child.kill()
        child.wait()
        raise
    if child.returncode != 0:
        # the child's one line: on its stdout (its stderr is the terminal's while progress is shown), else stderr's last
        said = _said(out)
        lines = [ln for ln in (err or "").splitlines() if ln.strip()]
        raise DerivationError(said or (lines[-1].removeprefix("nnmem-sweep: ") if lines else
                              f"tracing with {command(stack)[len('nnmem-sweep stack '):]} failed"))
    return json.loads(out)


def _said(out: str | None) -> str:
    """The error line a failed child wrote on its stdout ({"_error": ...}), "" where it wrote none."""
    try:
        doc = json.loads(out or "")
    except ValueError:
        return ""
    return str(doc.get("_error", "")) if isinstance(doc, dict) else ""


def _in_worker() -> bool:
    """Whether this process already traces one recipe per core (derivation.IN_WORKER): a child it starts then traces
    its probes one after another too, instead of starting a pool of its own (cores x cores processes)."""
    from .derivation import IN_WORKER

    return bool(IN_WORKER)


def _fail(message: str, code: int) -> int:
    """The child's error: one line on stderr and, for the parent to quote, on stdout."""
    print(f"nnmem-sweep: {message}", file=sys.stderr)
    sys.stdout.write(json.dumps({"_error": message}))
    return code


def _child() -> int:
    """The child: trace the request with the releases on this process's path; check they are the stated ones."""
    req = json.loads(sys.stdin.read())
    for pkg, want in req["stack"].items():
        got = installed(pkg)
        if got != want:
            return _fail(f"the side environment imports {pkg} {got}, not {want}", 3)
    if req.get("in_worker"):
        from .derivation import IN_WORKER

        IN_WORKER.append(True)
    s = req["source"]
    source = ModelSource.of(s["kind"], s["spec"], s["origin"], s["decoder_seq_len"], s["finetune"], s["preference"],
                            s["fsdp"])
    from . import document

    try:
        doc = document(source, tuple(req["what"]), req["progress"])
    except DerivationError as e:
        return _fail(str(e), 2)
    doc["_traced_with"] = versions()
    sys.stdout.write(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
