"""Shipped GGUF -> fp32 HF checkpoint folder: the reference weights when only a quantized GGUF is at hand.

transformers dequantizes the GGUF's tensors to fp32; its rebuilt tokenizer is wrong for GPT-2-style BPE vocabs
(see gguf_tokenizer), so the tokenizer files are replaced with the ones rebuilt from the GGUF's own metadata, and
the config's special ids are made to agree with them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from fastscore.deps import require
from fastscore.errors import ConversionError

log = logging.getLogger(__name__)

# transformers' own tokenizer files, which must not survive next to the rebuilt ones.
_STALE_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


def weights_note(gguf_path: Path, quant: str) -> str:
    return (
        f"fp32 weights dequantized from the shipped {quant.upper()} GGUF {gguf_path.name} (by transformers): "
        f"the original checkpoint is not available offline, so every variant inherits {quant.upper()}'s rounding"
    )


def gguf_to_hf(gguf_path: Path, out_dir: Path, tokenizer_dir: Path) -> Path:
    """Write an fp32 safetensors HF folder for `gguf_path` into `out_dir`, with the tokenizer from `tokenizer_dir`."""
    torch = require("torch", "reference")
    transformers = require("transformers", "reference")
    require("gguf", "tokenizer")
    require("accelerate", "reference")
    from fastscore.conversion.gguf_tokenizer import TOKENIZER_FILES, read_vocab

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    log.info("dequantizing %s to an fp32 HF checkpoint", gguf_path.name)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    except (ValueError, KeyError, RuntimeError) as exc:  # transformers' GGUF loader rejects unknown architectures
        raise ConversionError(f"transformers could not load {gguf_path}: {exc}") from exc
    vocab = read_vocab(gguf_path)
    for config in (model.config, model.generation_config):
        # The GGUF adds no BOS (tokenizer.ggml.add_bos_token false): no id must claim to be one.
        config.bos_token_id = None
        config.eos_token_id = vocab.eos_id
        config.pad_token_id = vocab.pad_id
    model.config.name_or_path = gguf_path.stem
    model.save_pretrained(str(out_dir), safe_serialization=True)
    del model
    for name in _STALE_TOKENIZER_FILES:
        (out_dir / name).unlink(missing_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(Path(tokenizer_dir) / name, out_dir / name)
    (out_dir / "fastscore_source.json").write_text(
        json.dumps({"source": str(gguf_path), "weights_note": weights_note(gguf_path, _file_quant(gguf_path))}, indent=2)
    )
    return out_dir


def _file_quant(gguf_path: Path) -> str:
    gguf = require("gguf", "tokenizer")
    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown"
    name = gguf.LlamaFileType(int(field.contents())).name
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
