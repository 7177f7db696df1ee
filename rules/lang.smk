# Lang: lexicon, phone/word tables, topology, L, Kneser-Ney LM and G for one training split.


rule lang:
    input:
        data=f"{RESULTS}/data",
    output:
        directory(f"{RESULTS}/lang/{{train}}"),
    wildcard_constraints:
        train="[^/]*train",
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "lang"),
        tests=lambda wildcards: " ".join(tests_of(config, wildcards.train)),
    log:
        f"{RESULTS}/logs/lang.{{train}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/lang.{{train}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow lang --config {params.config} --data {input.data} --train {wildcards.train}"
        " --tests {params.tests} --out {output} > {log} 2>&1"
