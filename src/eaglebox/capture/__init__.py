"""Code that runs inside SGLang's processes: the capture hook and its server-side sink."""
