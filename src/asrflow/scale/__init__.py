"""``asrflow bench scale``: how every stage's time and memory grow with the corpus, from a few hours to a hundred.

- :mod:`~asrflow.scale.corpus`: corpora of a given size from a real one's audio (speed and volume perturbed
  copies as new utterances and speakers, written once and reused);
- :mod:`~asrflow.scale.gmm`: the GMM stages (E-steps, tree, fMLLR, alignments) and the networks' data path;
- :mod:`~asrflow.scale.stages`: import, features, LM and graph, decoding, tuning, scoring and tracking;
- :mod:`~asrflow.scale.run`: the driver — one process per stage, one JSON line per stage and size.
"""
