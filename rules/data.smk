# Corpus import: recipe → validation on Dask → Kaldi data dirs + rejection report.


rule data:
    output:
        directory(f"{RESULTS}/data"),
    params:
        config=RESOLVED,
        # Reruns when these sections change (the resolved config file itself is not an input).
        fingerprint=stage_fingerprint(config, "data"),
        # the rejection report's copy that stays when the job fails (Snakemake removes a failed job's output)
        report=f"{RESULTS}/logs/data.report.tsv",
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=per_attempt(4000),  # MB, doubled on the retry (cluster/profile.yaml: retries)
        runtime=per_attempt(60),  # minutes (sbatch -t)
    log:
        f"{RESULTS}/logs/data.log",
    benchmark:
        f"{RESULTS}/benchmarks/data.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow data --config {params.config} --out {output} --report {params.report} --workers {threads}"
        " > {log} 2>&1"
