"""SGLang as eaglebox runs it: launch arguments, the server process, the install into an environment."""
