"""What the capture client and the server agree on: the capture spec, the request ids, the shard format."""
