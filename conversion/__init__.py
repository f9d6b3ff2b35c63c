"""Conversions between checkpoint formats: HF -> GGUF, HF -> ONNX, GGUF -> HF; each output is read back and checked."""
