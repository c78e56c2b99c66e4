"""Measuring drafts: offline acceptance through SGLang's own draft model, served acceptance and
throughput, layer parity of captured features."""
