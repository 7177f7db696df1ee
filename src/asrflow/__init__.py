"""asrflow: train and evaluate speech recognisers end to end.

Stages (one subpackage each, one word per concept across rules/, src/ and tests/):
``corpus`` (recipes), ``data`` (validated Kaldi data dirs), ``features`` (Dask feature
extraction), ``tracking`` (MLflow), ``config`` (schema validation), ``cluster`` (Dask clients).
"""

__version__ = "0.1.0"
