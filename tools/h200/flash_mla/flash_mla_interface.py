"""The one name SGLang 0.5.23 imports from here at module level (see the package's docstring)."""


class FlashMLASchedMeta:
    """Never built: no GPU check selects FlashMLA."""
