"""One module a CLI verb: each ``run(cfg)`` wires the config to the packages below it (the only place
that may import any of them)."""
