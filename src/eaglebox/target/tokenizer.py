"""The target's tokenizer, loaded one way by every stage."""

from __future__ import annotations

from eaglebox.errors import EagleboxError


def load_tokenizer(cfg):
    """``model.path``'s tokenizer; ``model.trust_remote_code`` lets its own code run (Kimi-K2.5 ships a
    tiktoken-based tokenizer class beside its weights)."""
    from transformers import AutoTokenizer

    m = cfg.model
    try:
        return AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
    except ValueError as err:
        if m.trust_remote_code or "trust_remote_code" not in str(err):
            raise
        raise EagleboxError(f"model.trust_remote_code: {m.path}'s tokenizer is code shipped with the model; set "
                            "model.trust_remote_code=true if you trust it (SGLang then gets --trust-remote-code "
                            "too)") from None
