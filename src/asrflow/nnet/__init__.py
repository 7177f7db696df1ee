"""Neural acoustic models: DNN/LSTM/CNN networks, hybrid (frame CE) and CTC training under torchrun.

Modules: ``models`` (factory), ``sizes`` (each type's sizes and defaults, torch-free),
``data`` (lazy features, buckets, chunks), ``objectives``, ``units`` (sentencepiece),
``train`` (the one trainer), ``stage`` (the nnet stage), ``hybrid`` and ``inference``
(decoding helpers), ``transcribe`` (wav files to text).
"""


class NnetError(ValueError):
    """A network cannot be trained on this data (named in the message)."""
