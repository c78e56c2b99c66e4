"""eaglebox: capture EAGLE-3 features with the SGLang build that serves, train a draft, serve and bench it."""

__version__ = "0.1.0"
SGLANG_VERSION = "0.5.23"
"""The only SGLang release the capture hook and the CPU kernels are written and tested against."""
