"""A Hugging Face model id that is not one of the shipped presets (`preset: Qwen/Qwen2.5-7B-Instruct`, issue 21): its
config.json alone, never weights.

1. The local Hugging Face cache, as huggingface_hub lays it out: $HF_HUB_CACHE, else $HF_HOME/hub, else
   ~/.cache/huggingface/hub; models--ORG--NAME/snapshots/REVISION/config.json, the revision refs/main names (else the
   newest snapshot holding one).
2. nnmem_sweep's own cache (NNMEM_SWEEP_CACHE or ~/.cache/nnmem_sweep: hub/ORG--NAME/config.json), where a fetch kept
   it.
3. Only where the user allows the network (NNMEM_SWEEP_ALLOW_NETWORK=1): huggingface_hub's hf_hub_download of
   config.json (gated repositories need the user's token, as for any download), kept in 2.

Otherwise one line: which file is needed and the two ways to get it."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..paths import atomic_write_bytes, user_cache_dir

NETWORK_ENV = "NNMEM_SWEEP_ALLOW_NETWORK"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_id(name: str) -> bool:
    """ORG/NAME as the Hugging Face Hub spells a model repository."""
    return bool(_ID.match(name or ""))


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _own_copy(repo_id: str) -> Path:
    return user_cache_dir() / "hub" / repo_id.replace("/", "--") / "config.json"


def _in_hub_cache(repo_id: str) -> tuple[Path, str] | None:
    repo = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8").strip()
        if (snaps / rev / "config.json").is_file():
            return snaps / rev / "config.json", rev
    found = sorted((p for p in snaps.glob("*/config.json")), key=lambda p: p.stat().st_mtime, reverse=True)
    return (found[0], found[0].parent.name) if found else None


def config_path(repo_id: str) -> tuple[Path, str]:
    """(the config.json of `repo_id`, where it came from, in words); ValueError, one line, where it is not to be
    had without the network and the network is not allowed (or the fetch failed)."""
    hit = _in_hub_cache(repo_id)
    if hit:
        return hit[0], f"{repo_id} (Hugging Face cache, revision {hit[1][:12]})"
    own = _own_copy(repo_id)
    if own.is_file():
        return own, f"{repo_id} (config.json fetched into {own.parent})"
    if os.environ.get(NETWORK_ENV) != "1":
        raise ValueError(f"{repo_id!r} is not a shipped preset and its config.json is not in the Hugging Face cache "
                         f"({hub_cache()}): fetch it (`huggingface-cli download {repo_id} config.json`), let "
                         f"nnmem-sweep fetch config.json alone ({NETWORK_ENV}=1), or give hf_config: path/to/config.json")
    return _fetch(repo_id, own), f"{repo_id} (config.json fetched into {own.parent})"


def _fetch(repo_id: str, dest: Path) -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ValueError(f"fetching {repo_id}'s config.json needs huggingface_hub (pip install huggingface_hub)") \
            from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = hf_hub_download(repo_id, "config.json", cache_dir=tmp)
        except Exception as e:  # noqa: BLE001 - offline, gated, no such repository: one line
            raise ValueError(f"could not fetch {repo_id}'s config.json: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
        atomic_write_bytes(dest, Path(got).read_bytes())
    return dest
