"""Load a model's tokenizer exactly as its backend tokenizes text.

    from proxy.tokenizers import load_tokenizer
    loaded = load_tokenizer("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids

Sources: a GGUF file (byte-level BPE vocabularies, converted the way llama.cpp tokenizes), a
Hugging Face tokenizer.json, a directory that holds one, or a Codec tokenizer map (v2 JSON with
`vocab` and `merges`).
"""

from proxy.tokenizers.errors import TokenizerLoadError
from proxy.tokenizers.loaded import LoadedTokenizer
from proxy.tokenizers.loader import load_tokenizer

__all__ = ["LoadedTokenizer", "TokenizerLoadError", "load_tokenizer"]
