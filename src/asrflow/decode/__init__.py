"""Decoding with HCLG and Kaldi's faster decoder (1-best), in Dask tasks over shards."""
