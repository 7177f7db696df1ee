"""Neural acoustic models (issue 4, in progress): model zoo and data pipeline.

Models and the feature pipeline are in place and tested; the trainer (torchrun), hybrid
and CTC decoding and the comparison report are not built yet.
"""
