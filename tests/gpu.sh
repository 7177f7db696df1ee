#!/usr/bin/env bash
# The GPU checks, for a machine with one GPU: the GPU tests of the trainer, then the trainer
# against a bare loop for every model preset, and the DNN compiled (JSON lines to $1/nnet_bare_<gpu>.jsonl).
#   bash tests/gpu.sh [out-folder] [presets]
# Needs the project importable (pip install -e . or PYTHONPATH=src) and a CUDA build of torch.
set -uo pipefail
out=${1:-docs/bench}
presets=${2:-dnn_6x2048,cnn_tdnn_20m,blstm_3x512,conformer_20m}
mkdir -p "$out"
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())")
status=0
python3 -m pytest -q -p no:cacheprovider tests/nnet/test_gpu.py tests/nnet/test_train.py tests/nnet/test_models.py \
  tests/parallel/test_strategies.py::test_every_strategy_runs_two_learners_on_one_gpu_over_gloo \
  2>&1 | tee "$out/gpu_tests_$gpu.log" || status=1
PYTHONUNBUFFERED=1 python3 -m asrflow.cli bench nnet --bare --presets "$presets" --frames 2260000 --max-frames 64000 \
  --workers 8 --epochs 2 --out "$out/nnet_bare_$gpu.jsonl" 2>&1 | tee "$out/nnet_bare_$gpu.log" || status=1
PYTHONUNBUFFERED=1 python3 -m asrflow.cli bench nnet --bare --presets dnn_6x2048 --frames 2260000 --max-frames 64000 \
  --workers 8 --epochs 2 --compile --out "$out/nnet_bare_$gpu.jsonl" 2>&1 | tee -a "$out/nnet_bare_$gpu.log" || status=1
exit $status
