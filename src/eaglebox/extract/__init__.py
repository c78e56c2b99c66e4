"""Extraction client: data set rows to verified capture requests to shards."""
