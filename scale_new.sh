#!/bin/bash
# usage: scale_new.sh OUT STAGES HOURS...
cd /work/runs/so762
R=results/speechocean762
export PYTHONPATH=/work/bench_src ASRFLOW_DATA_MIRROR=/work/corpora_full
out=$1; stages=$2; shift 2
for h in "$@"; do
  /work/main/.venv/bin/python -m asrflow.cli bench scale -c /work/runs/so762/config_bench.yaml --data $R/data --features $R/features/mfcc --lang $R/lang/train --model $R/gmm/train/tri --train train --hours $h --workers 2 --audio-cache /work/scale_audio ${stages:+--stages $stages} --out $out
done
