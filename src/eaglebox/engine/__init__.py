"""SGLang as eaglebox runs it: the pinned version, launch arguments, the server process, CPU support."""
