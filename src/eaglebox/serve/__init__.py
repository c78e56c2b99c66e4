"""Serving target + draft with SGLang EAGLE-3."""
