"""Progress bars for long work; in a log (no terminal) they print a line every 10 s instead of redrawing."""

import sys
import weakref

from tqdm import tqdm

_bars: "weakref.WeakSet[tqdm]" = weakref.WeakSet()


def bar(**kwargs) -> tqdm:
    interactive = sys.stderr.isatty()
    b = tqdm(dynamic_ncols=interactive, mininterval=0.1 if interactive else 10, **kwargs)
    _bars.add(b)
    return b


def end_bars() -> None:
    """Close every bar still open, ending its line: an error printed next stands on its own line, and
    no bar is redrawn after it when the bar is collected (closing a closed bar does nothing)."""
    for b in list(_bars):
        b.close()
