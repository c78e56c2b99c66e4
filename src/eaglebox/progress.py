"""Progress bars for long work; in a log (no terminal) they print a line every 10 s instead of redrawing."""

import sys

from tqdm import tqdm


def bar(**kwargs) -> tqdm:
    interactive = sys.stderr.isatty()
    return tqdm(dynamic_ncols=interactive, mininterval=0.1 if interactive else 10, **kwargs)
