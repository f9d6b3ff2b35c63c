"""Random-weight stand-ins of the registry's checkpoints, built with each one's exact config (models/registry.toml).

The hub is unreachable on the study machine, so time and memory at real size are measured on models that have the
real shapes (layers, widths, heads, GQA, head_dim, RoPE, the real vocabulary size, tied embeddings) and random weights.
They carry the embedded SmolLM2 tokenizer, whose ids fit every registry vocabulary; the embedding and lm_head keep
the real vocabulary size, which sets the cost of a scored token. Their scores mean nothing: every place a stand-in
appears (its cache folder, config.json, the weights note, bench and sweep tables) says what it is.

The weights are generated tensor by tensor into safetensors shards, so a 1.7B fp32 model (6.8 GB) never needs more
than one shard in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from fastscore.deps import require
from fastscore.errors import UnsupportedError
from fastscore.registry import ModelEntry

log = logging.getLogger(__name__)

# `MODEL@standin` names the random-weight stand-in of registry model MODEL.
SUFFIX = "@standin"
# In the cache key, the folder name, config.json and every table, so no output can pass for the real checkpoint.
MARK = "STAND-IN (random weights)"
KEY_SUFFIX = "-standin-random"
RECORD = "fastscore_standin.json"
# transformers' own initializer_range: a realistic weight scale (these measure throughput, not behaviour).
INIT_STD = 0.02
SHARD_BYTES = 2_000_000_000


def is_standin(model: str) -> bool:
    return model.endswith(SUFFIX)


def base_name(model: str) -> str:
    return model.removesuffix(SUFFIX)


def label(model: str) -> str:
    """How a table names the model: the stand-in mark spelled out."""
    return f"{base_name(model)} [{MARK}]" if is_standin(model) else model


def hf_config(entry: ModelEntry, eos_id: int | None, pad_id: int | None):
    """The transformers config of `entry`'s real architecture (its registry [config] table)."""
    transformers = require("transformers", "reference")
    if not entry.config:
        raise UnsupportedError(f"the registry holds no architecture config for {entry.name!r}, so no stand-in can "
                               "be built for it (add a [models.NAME.config] table to models/registry.toml)")
    classes = {"LlamaForCausalLM": transformers.LlamaConfig, "Qwen2ForCausalLM": transformers.Qwen2Config,
               "Qwen3ForCausalLM": transformers.Qwen3Config}
    if entry.architecture not in classes:
        raise UnsupportedError(f"no stand-in for architecture {entry.architecture!r}; known: {', '.join(classes)}")
    fields = dict(entry.config)
    if entry.architecture != "LlamaForCausalLM":
        fields.setdefault("use_sliding_window", False)
    return classes[entry.architecture](
        **fields, initializer_range=INIT_STD, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
        architectures=[entry.architecture],
    )


def _tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _init_tensor(torch, name: str, shape: tuple[int, ...], seed: int):
    generator = torch.Generator().manual_seed(_tensor_seed(seed, name))
    if name.endswith("norm.weight"):
        # Norm gains near 1, jittered so a converter that drops or misplaces one still changes the scores.
        return 1.0 + 0.1 * torch.randn(shape, generator=generator, dtype=torch.float32)
    return INIT_STD * torch.randn(shape, generator=generator, dtype=torch.float32)


def parameter_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every saved tensor's name and shape, from a model instantiated on the meta device (no memory)."""
    torch = require("torch", "reference")
    transformers = require("transformers", "reference")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)  # stored once, as the embedding (as save_pretrained does)
    return shapes


def build_standin(entry: ModelEntry, out_dir: Path, tokenizer_dir: Path, seed: int = 0,
                  shard_bytes: int = SHARD_BYTES) -> Path:
    """Write the stand-in of `entry` (fp32 safetensors shards, config, tokenizer files) into `out_dir`."""
    torch = require("torch", "reference")
    transformers = require("transformers", "reference")
    safetensors_torch = require("safetensors.torch", "reference", package="safetensors")
    from fastscore.conversion.gguf_tokenizer import TOKENIZER_FILES

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        (out_dir / name).write_bytes((Path(tokenizer_dir) / name).read_bytes())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    if len(tokenizer) > int(entry.config["vocab_size"]):
        raise UnsupportedError(f"the stand-in tokenizer has {len(tokenizer)} ids, more than {entry.name}'s vocabulary")
    eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    pad_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token) if tokenizer.pad_token else None
    config = hf_config(entry, eos_id, pad_id)
    config.fastscore_standin = MARK  # in config.json: whatever reads the folder sees what it is
    shapes = parameter_shapes(config)
    # Only the names of written shards are kept: holding their tensors would put the whole model in memory.
    shard_names: list[list[str]] = []
    current, current_bytes = {}, 0
    for name, shape in shapes.items():
        tensor = _init_tensor(torch, name, shape, seed)
        if current and current_bytes + tensor.numel() * 4 > shard_bytes:
            shard_names.append(list(current))
            _write_shard(safetensors_torch, out_dir, current, len(shard_names))
            current, current_bytes = {}, 0
        current[name] = tensor
        current_bytes += tensor.numel() * 4
        del tensor
    shard_names.append(list(current))
    _write_shard(safetensors_torch, out_dir, current, len(shard_names))
    del current
    files = _name_shards(out_dir, len(shard_names))
    if len(files) > 1:
        weight_map = {name: files[i] for i, names in enumerate(shard_names) for name in names}
        total = sum(4 * _numel(shape) for shape in shapes.values())
        (out_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config.save_pretrained(str(out_dir))
    transformers.GenerationConfig(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(
        str(out_dir))
    n_params = sum(_numel(shape) for shape in shapes.values())
    (out_dir / RECORD).write_text(json.dumps({
        "standin": MARK, "of": entry.name, "hub_id": entry.hub_id, "architecture": entry.architecture,
        "config": dict(entry.config), "seed": seed, "init_std": INIT_STD, "parameters": n_params,
        "tokenizer": "the embedded SmolLM2-135M tokenizer (its ids fit the real vocabulary, which is kept)",
    }, indent=2))
    log.info("built the %s of %s (%d parameters, %d shard(s)) in %s", MARK, entry.name, n_params, len(files), out_dir)
    return out_dir


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _write_shard(safetensors_torch, out_dir: Path, tensors: dict, index: int) -> None:
    safetensors_torch.save_file(tensors, str(out_dir / f".shard-{index:05d}.safetensors"), metadata={"format": "pt"})


def _name_shards(out_dir: Path, count: int) -> list[str]:
    """Rename the written shards to transformers' names, now that their number is known."""
    names = (["model.safetensors"] if count == 1 else
             [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)])
    for i, name in enumerate(names, start=1):
        (out_dir / f".shard-{i:05d}.safetensors").rename(out_dir / name)
    return names


def standin_record(folder: Path) -> dict | None:
    path = Path(folder) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None
