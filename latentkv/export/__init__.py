"""Export: a DeepSeek-family folder as a GGUF file for llama.cpp (and Ollama): `export_gguf`."""

from latentkv.export.gguf_writer import export_gguf

__all__ = ["export_gguf"]
