# Scoring: WER, SER, S/D/I, per speaker and per group of speakers (evaluation.groups); one summary
# JSON per system and test split.


rule score:
    input:
        data=f"{RESULTS}/data",
        decode=f"{RESULTS}/decode/{{system}}/{{test}}",
        lang=lambda wildcards: f"{RESULTS}/lang/{train_split(wildcards.test, config)}",
    output:
        f"{RESULTS}/score/{{system}}/{{test}}.json",
    wildcard_constraints:
        test="[^/]*test",
        system="[A-Za-z][A-Za-z0-9_]*",
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "score"),
    log:
        f"{RESULTS}/logs/score.{{system}}.{{test}}.log",
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow score --config {params.config} --system {wildcards.system} --test {wildcards.test}"
        " --data {input.data} --decode {input.decode} --lang {input.lang} --out {output} > {log} 2>&1"
