# Neural acoustic models: one torchrun job per network and training split.
# Hybrid networks learn the GMM's tied states from its alignments; CTC networks learn units
# from the transcripts. nnet.parallel.learners learners (gloo on CPU, NCCL on GPU) share the job,
# exchanging gradients or models as nnet.parallel.strategy says.


rule nnet:
    input:
        unpack(lambda wildcards: nnet_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/nnet/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(network_systems(config)),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "nnet", system=wildcards.system),
        learners=lambda wildcards: parallel_settings(config, wildcards.system)["learners"],
        state=lambda wildcards: f"{RESULTS}/nnet_state/{wildcards.train}/{wildcards.system}",
        optional=lambda wildcards, input: optional_args(input, "gmm", "graph", "lang"),
    threads: workflow.cores
    resources:
        mem_mb=4000,
    log:
        f"{RESULTS}/logs/nnet.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/nnet.{{train}}.{{system}}.tsv"
    conda:
        "../envs/gpu.yaml"
    shell:
        "torchrun --nnodes 1 --nproc-per-node {params.learners} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0"
        " --no-python asrflow nnet --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --data {input.data} --features {input.features} {params.optional} --state {params.state}"
        " --threads {threads} --out {output} > {log} 2>&1"
