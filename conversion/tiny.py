"""Tiny random-weight checkpoints of the registry's architectures, for testing every conversion path quickly.

They use the real SmolLM2 vocabulary (rebuilt from the embedded GGUF) so tokenization, chat templates and the
converters see a realistic tokenizer, while the transformer itself is a few layers of width 64.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from fastscore.deps import require
from fastscore.errors import UnsupportedError

log = logging.getLogger(__name__)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 2048
# Wider than transformers' default 0.02 so the next-token distributions are peaked (log-probs spread over
# several nats) and quantisation differences are visible rather than drowned in a flat softmax.
INIT_STD = 0.25


def _config(arch: str, vocab_size: int, eos_id: int, pad_id: int | None):
    transformers = require("transformers", "reference")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=INIT_STD,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, use_sliding_window=False)
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=HIDDEN // HEADS, use_sliding_window=False)
    raise UnsupportedError(f"no tiny model for architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")


def build_tiny_model(arch: str, out_dir: Path, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Write a seeded random `arch` checkpoint (fp32 safetensors) with the SmolLM2 tokenizer into out_dir.

    tokenizer_dir: a folder written by gguf_tokenizer.write_tokenizer_dir; default: rebuilt from the embedded GGUF.
    """
    torch = require("torch", "reference")
    transformers = require("transformers", "reference")
    from fastscore.conversion.gguf_tokenizer import TOKENIZER_FILES, write_tokenizer_dir

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        from fastscore.embedded import embedded_gguf
        from fastscore.registry import default_model, get

        write_tokenizer_dir(embedded_gguf(get(default_model())), out_dir)
    else:
        for name in TOKENIZER_FILES:
            shutil.copy2(Path(tokenizer_dir) / name, out_dir / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    pad_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token) if tokenizer.pad_token else None
    config = _config(arch, len(tokenizer), eos_id, pad_id)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Norm weights start at exactly 1; jitter them so a converter that drops or misplaces one is caught.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.mul_(1.0 + 0.1 * torch.randn_like(param))
    model.generation_config.bos_token_id = None
    model.save_pretrained(str(out_dir), safe_serialization=True)
    log.info("built tiny %s (%d parameters) in %s", arch, sum(p.numel() for p in model.parameters()), out_dir)
    return out_dir
