"""Serving target + draft with SGLang EAGLE-3: the provenance check before the server starts."""
