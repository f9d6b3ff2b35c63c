"""Fetch a registry model's HF checkpoint from the model hub (or the local hub cache), failing fast when offline."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fastscore.deps import require
from fastscore.errors import ArtefactUnavailableError

log = logging.getLogger(__name__)

# Seconds to wait for the hub's first answer: an unreachable hub must fail in seconds, not minutes.
HUB_TIMEOUT = 10.0
# What a causal LM checkpoint needs; skips other formats (pytorch_model.bin, onnx/, gguf) the repo may also hold.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer.model"]


def hub_offline() -> bool:
    """HF_HUB_OFFLINE=1 (huggingface_hub's own switch): use the local hub cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def how_to_provide(name: str, hub_id: str) -> str:
    return (
        f"download {hub_id} where the hub is reachable (e.g. `hf download {hub_id}`), copy the folder here and "
        f"pass it with --hf-path DIR (e.g. fastscore convert {name} --hf-path DIR)"
    )


def hub_snapshot(name: str, hub_id: str) -> Path:
    """The local folder of `hub_id`'s checkpoint: from the hub cache, else downloaded (unless offline)."""
    hub = require("huggingface_hub", "reference", package="huggingface-hub")
    try:
        return Path(hub.snapshot_download(hub_id, allow_patterns=CHECKPOINT_FILES, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError and friends: not cached, go online below
        log.debug("%s is not in the local hub cache: %s", hub_id, exc)
    if hub_offline():
        raise ArtefactUnavailableError(
            f"the HF checkpoint of {name!r} is not local and HF_HUB_OFFLINE is set; {how_to_provide(name, hub_id)}"
        )
    try:
        # snapshot_download's own metadata call has no timeout; this probe makes an unreachable hub fail fast.
        hub.HfApi().model_info(hub_id, timeout=HUB_TIMEOUT)
        log.info("downloading %s from the hub", hub_id)
        return Path(hub.snapshot_download(hub_id, allow_patterns=CHECKPOINT_FILES, etag_timeout=HUB_TIMEOUT))
    except Exception as exc:  # connection errors, gated/missing repos: all mean "not available here"
        reason = (str(exc).splitlines() or [""])[0]
        reason = reason if len(reason) <= 120 else reason[:117] + "..."
        raise ArtefactUnavailableError(
            f"the HF checkpoint of {name!r} is not local and the hub could not provide {hub_id} "
            f"({type(exc).__name__}: {reason}); {how_to_provide(name, hub_id)}"
        ) from exc
