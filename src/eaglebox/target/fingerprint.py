"""The target's identity, as the capture spec records it: its config, its weights, its tokenizer.

Serving compares it with the draft's (``serve/provenance.py``): a draft trained on one target's
features is refused on another, also when the two share a byte-identical ``config.json``. Hashing a
1T-parameter checkpoint would take minutes each command, so each safetensors file is named by its
size, the sha256 of its header (names, dtypes, shapes, offsets) and the sha256 of
:data:`SAMPLED_BLOCKS` blocks spread over its data: retrained or other weights of the same shapes
differ there; files smaller than the blocks are hashed whole.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eaglebox.errors import EagleboxError

SAMPLED_BLOCKS, BLOCK_BYTES = 32, 64 << 10
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer*", "tokenization_*.py", "special_tokens_map.json", "added_tokens.json", "vocab.*",
                   "merges.txt", "*.tiktoken", "tiktoken.model", "chat_template*")
"""What transformers (and custom tokenizer code such as Kimi's) reads to tokenize."""

WHAT = {"config_sha256": "config.json", "weights_sha256": "weights (safetensors names, sizes, headers, sampled bytes)",
        "tokenizer_sha256": "tokenizer files"}
"""What each item of :func:`target_fingerprint` covers, for messages."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _safetensors_entry(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise EagleboxError(f"{path}: not a safetensors file (header length {n} beyond its {size} bytes)")
        header = f.read(n)
        start, data = 8 + n, size - 8 - n
        sampled = hashlib.sha256()
        if data <= SAMPLED_BLOCKS * BLOCK_BYTES:
            sampled.update(f.read())
        else:
            for k in range(SAMPLED_BLOCKS):
                f.seek(start + k * (data - BLOCK_BYTES) // (SAMPLED_BLOCKS - 1))
                sampled.update(f.read(BLOCK_BYTES))
    return {"file": path.name, "bytes": size, "header_sha256": _sha256(header), "sampled_sha256": sampled.hexdigest()}


def weights_sha256(model_path: Path) -> str:
    """The weight files named by the safetensors index (its bytes included), or every ``*.safetensors``."""
    index = model_path / INDEX
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (model_path / n).exists()]
        if missing:
            raise EagleboxError(f"{index} names {missing[:3]}, which are not in {model_path}")
        files, index_sha = [model_path / n for n in names], _sha256(index.read_bytes())
    else:
        files, index_sha = sorted(model_path.glob("*.safetensors")), None
    entries = [_safetensors_entry(f) for f in files]
    return _sha256(json.dumps({"index_sha256": index_sha, "files": entries}, sort_keys=True).encode())


def tokenizer_sha256(model_path: Path) -> str:
    files = sorted({p for pattern in TOKENIZER_FILES for p in model_path.glob(pattern) if p.is_file()})
    return _sha256(json.dumps([[p.name, _sha256(p.read_bytes())] for p in files]).encode())


def target_fingerprint(model_path: Path) -> dict:
    """One sha256 per item of :data:`WHAT`, computed once a command (through the capture spec)."""
    model_path = Path(model_path)
    return {"config_sha256": _sha256((model_path / "config.json").read_bytes()),
            "weights_sha256": weights_sha256(model_path), "tokenizer_sha256": tokenizer_sha256(model_path)}
