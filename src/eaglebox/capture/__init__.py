"""Code that runs inside SGLang's processes: the capture hook, its server-side sink, their activation."""
