"""The shard format (safetensors + manifest) and the parity oracle that checks its contents."""
