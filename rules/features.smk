# Features on Dask: one rule instance per kind (mfcc for GMM-HMM, fbank for neural models).


rule features:
    input:
        data=f"{RESULTS}/data",
    output:
        directory(f"{RESULTS}/features/{{kind}}"),
    wildcard_constraints:
        kind="mfcc|fbank",
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "features", wildcards.kind),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("features", "mem_mb"),  # MB (sbatch --mem)
        runtime=job_resource("features", "runtime"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    log:
        f"{RESULTS}/logs/features.{{kind}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/features.{{kind}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow features --config {params.config} --data {input.data} --kind {wildcards.kind}"
        " --out {output} --workers {threads} > {log} 2>&1"
