"""Decoding with HCLG and Kaldi's lattice-faster decoder, in Dask tasks over shards."""
