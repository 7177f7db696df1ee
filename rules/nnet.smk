# Neural acoustic models: one torchrun job per network and training split.
# Hybrid networks learn the GMM's tied states from its alignments; CTC networks learn units
# from the transcripts. nnet.parallel.learners learners (gloo on CPU, NCCL on GPU) share the job,
# exchanging gradients or models as nnet.parallel.strategy says. `asrflow launch` starts them:
# torchrun on this machine, or srun + torchrun per node when nnet.parallel.nodes > 1 (Slurm).


rule nnet:
    input:
        unpack(lambda wildcards: nnet_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/nnet/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(trained_networks(config)),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "nnet", system=wildcards.system),
        state=lambda wildcards: f"{RESULTS}/nnet_state/{wildcards.train}/{wildcards.system}",
        optional=lambda wildcards, input: optional_args(input, "gmm", "alignments", "graph", "lang", "init", "teacher"),
    threads: nnet_threads(config, CORES)
    resources:
        mem_mb=job_resource("nnet", "mem_mb", reads="network", config=config),  # MB (sbatch --mem)
        runtime=job_resource("nnet", "runtime", reads="network", config=config),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
        nodes=lambda wildcards: launch_resources(config, wildcards.system)["nodes"],
        tasks=lambda wildcards: launch_resources(config, wildcards.system)["tasks"],
        mpi=lambda wildcards: launch_resources(config, wildcards.system)["mpi"],
        gres=lambda wildcards: launch_resources(config, wildcards.system)["gres"],
        tasks_per_gpu=lambda wildcards: launch_resources(config, wildcards.system)["tasks_per_gpu"],
    priority: 1
    log:
        f"{RESULTS}/logs/nnet.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/nnet.{{train}}.{{system}}.tsv"
    conda:
        "../envs/gpu.yaml"
    shell:
        # nodes, launcher and port come from the config, not params: moving onto a cluster reruns nothing
        "asrflow launch --config {params.config} --system {wildcards.system} -- asrflow nnet --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --data {input.data} --features {input.features} {params.optional} --state {params.state}"
        " --threads {threads} --out {output} > {log} 2>&1"


# An ensemble is assembled from its members' trained networks (frame-level combination of
# their tied-state posteriors); it is then tuned, decoded and scored like any hybrid network.
rule ensemble:
    input:
        unpack(lambda wildcards: ensemble_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/nnet/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(ensemble_systems(config)),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "ensemble", system=wildcards.system),
    resources:
        mem_mb=per_attempt(2000),  # MB, doubled on the retry (cluster/profile.yaml: retries)
        runtime=per_attempt(30),  # minutes (sbatch -t)
    priority: 1
    log:
        f"{RESULTS}/logs/ensemble.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/ensemble.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow ensemble --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --members {input.members} --features {input.features} --gmm {input.gmm} --graph {input.graph}"
        " --lang {input.lang} --out {output} > {log} 2>&1"
