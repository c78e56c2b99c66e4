"""Imported by a ``.pth`` line in every interpreter of the environment; inert unless asked.

``EAGLEBOX_CAPTURE_DIR`` set -> install the capture hook (``eaglebox.capture.hook``);
``EAGLEBOX_EXPECT_LAYER_INPUTS`` set -> install the serving check (``eaglebox.capture.serve_check``).
Nothing else is imported here, so ordinary Python processes pay nothing.
"""

import os

if os.environ.get("EAGLEBOX_CAPTURE_DIR"):
    from eaglebox.capture.hook import install_import_hook

    install_import_hook()

if os.environ.get("EAGLEBOX_EXPECT_LAYER_INPUTS"):
    from eaglebox.capture.serve_check import install_import_hook as install_serve_check

    install_serve_check()
