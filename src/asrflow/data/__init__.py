"""The data stage: validated Kaldi data dirs from a corpus recipe."""

from asrflow.data.datadir import DataDirError, read_data_dir, write_data_dir
from asrflow.data.validate import Rejection, Utterance

__all__ = ["DataDirError", "Rejection", "Utterance", "read_data_dir", "write_data_dir"]
