"""The target's tokenizer, loaded one way by every stage."""

from __future__ import annotations

import json
from pathlib import Path

from eaglebox.errors import EagleboxError


def load_tokenizer(m):
    """``model.path``'s tokenizer (``m``: the config's ``model`` section; untyped, as config imports
    target). ``model.trust_remote_code`` lets its own code run (Kimi-K2.5 ships a tiktoken-based
    tokenizer class beside its weights, named by ``auto_map`` in ``tokenizer_config.json``).
    Without it such a tokenizer is refused up front: transformers would fall back to a generic class
    and fail with an error that does not name the cause."""
    from transformers import AutoTokenizer

    tok_cfg = Path(m.path) / "tokenizer_config.json"
    remote = tok_cfg.exists() and "AutoTokenizer" in (json.loads(tok_cfg.read_text()).get("auto_map") or {})
    if remote and not m.trust_remote_code:
        raise EagleboxError(f"model.trust_remote_code: {tok_cfg} names a tokenizer class shipped as code with the "
                            "model (auto_map); set model.trust_remote_code=true if you trust it (SGLang then gets "
                            "--trust-remote-code too)")
    return AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
