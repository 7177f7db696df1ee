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


# The lang decoder tuning decodes the held-out utterances with (every system of the split tunes on
# the same ones): the split's lang with an LM estimated without their transcripts.
rule lang_heldout:
    input:
        data=f"{RESULTS}/data",
        lang=f"{RESULTS}/lang/{{train}}",
    output:
        directory(f"{RESULTS}/lang/{{train}}_heldout"),
    wildcard_constraints:
        train="[^/]*train",
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "lang_heldout"),
    log:
        f"{RESULTS}/logs/lang.{{train}}_heldout.log",
    benchmark:
        f"{RESULTS}/benchmarks/lang.{{train}}_heldout.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow lang --config {params.config} --data {input.data} --train {wildcards.train}"
        " --heldout-of {input.lang} --out {output} > {log} 2>&1"
