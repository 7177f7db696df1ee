# The comparison of the experiment's systems (asrflow compare, from MLflow) and the
# figures `snakemake --report report.html` embeds.
from pathlib import Path


rule compare:
    input:
        score_targets(config),
    output:
        table=report(f"{RESULTS}/compare/table.html", category="Comparison", caption="../workflow/report/table.rst"),
        markdown=f"{RESULTS}/compare/table.md",
        csv=f"{RESULTS}/compare/table.csv",
        wer=report(f"{RESULTS}/compare/wer.png", category="Comparison", caption="../workflow/report/wer.rst"),
        curves=report(
            f"{RESULTS}/compare/training_curves.png", category="Training", caption="../workflow/report/curves.rst"
        ),
    params:
        config=RESOLVED,
        experiment=config["experiment"],
        systems=" ".join(config["evaluation"]["systems"]),
        tests=" ".join(config["evaluation"]["test_sets"]),
        out=lambda wildcards, output: Path(output.table).parent,
    log:
        f"{RESULTS}/logs/compare.log",
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow compare {params.experiment} --config {params.config} --systems {params.systems}"
        " --tests {params.tests} --out {params.out} --plots > {log} 2>&1"


# The parallel-training study (nnet.parallel_study.enabled): every strategy measured with
# real learner processes, beside the timing model and the simulator, plus the emulated
# accuracy vs learners. Timings need a quiet machine: the rule takes every core.
rule parallel_study:
    input:
        unpack(lambda wildcards: nnet_inputs(config, "train", config["nnet"]["parallel_study"]["system"])),
    output:
        bench=f"{RESULTS}/parallel/bench.jsonl",
        summary=f"{RESULTS}/parallel/summary.md",
        speedup=report(f"{RESULTS}/parallel/speedup.png", category="Parallel training", caption="../workflow/report/speedup.rst"),
        accuracy=report(f"{RESULTS}/parallel/accuracy.png", category="Parallel training", caption="../workflow/report/accuracy.rst"),
        bytes=report(f"{RESULTS}/parallel/bytes.png", category="Parallel training", caption="../workflow/report/bytes.rst"),
    params:
        config=RESOLVED,
        study=lambda wildcards: study_args(config),
        out=lambda wildcards, output: Path(output.bench).parent,
    threads: CORES
    log:
        f"{RESULTS}/logs/parallel_study.log",
    conda:
        "../envs/gpu.yaml"
    shell:
        "asrflow bench parallel --config {params.config} --data {input.data} --features {input.features}"
        " --gmm {input.gmm} {params.study} --out {params.out} --study > {log} 2>&1"
