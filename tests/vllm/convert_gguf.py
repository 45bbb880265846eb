"""GGUF -> Hugging Face directory for vLLM, run by vLLM's own interpreter (tests/vllm/backend.py).

    <vllm venv>/bin/python tests/vllm/convert_gguf.py MODEL.gguf OUT_DIR

vLLM serves Hugging Face directories, not GGUF files. transformers reads the GGUF (dequantized
to bfloat16) and its tokenizer and chat template; what it cannot do for SmolLM2 is done here:

* `save_pretrained` refuses a model loaded from GGUF ("not serializable"), so the weights go out
  with safetensors and `config.json` without the GGUF `quantization_config`.
* SmolLM2 ties its output layer to its embeddings (`tie_word_embeddings`): both names hold one
  tensor. Only `model.embed_tokens.weight` is kept; a file holding `lm_head.weight` alone makes
  vLLM generate token 0 forever.
* The tokenizer.json transformers writes lacks SmolLM2's digit splitting; the caller replaces it
  with the proxy's own conversion and keeps this one as `tokenizer.transformers.json`, a
  near-miss tokenizer for the drift check.

It imports nothing from the project: the project's virtualenv has no torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

TIED = "lm_head.weight"


def convert(gguf: Path, out: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    if not model.config.tie_word_embeddings:
        raise SystemExit(f"{gguf}: expected tied embeddings (SmolLM2), found none")
    weights = {
        name: tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
        if name != TIED
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)  # where the GGUF was read from, here
    # vLLM picks its model class by this name, which a config read from a GGUF leaves empty.
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    (out / "tokenizer.json").rename(out / "tokenizer.transformers.json")


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
