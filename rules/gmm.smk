# GMM-HMM training on Dask: flat-start monophone, triphone from its alignments, triphone on LDA+MLLT
# features (lda) from the tri's, and the speaker-adaptively trained triphone (sat) on the lda's
# fMLLR-adapted features.


rule gmm:
    input:
        unpack(lambda wildcards: gmm_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/gmm/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "gmm", system=wildcards.system),
        source=lambda wildcards, input: optional_args(input, "source"),
        state=lambda wildcards: f"{RESULTS}/gmm_state/{wildcards.train}/{wildcards.system}",  # survives a failure
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("gmm", "mem_mb", reads="train"),  # MB (sbatch --mem)
        runtime=job_resource("gmm", "runtime", reads="train"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    priority: 10
    log:
        f"{RESULTS}/logs/gmm.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/gmm.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow gmm --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --data {input.data} --features {input.features} --lang {input.lang} {params.source}"
        " --state {params.state} --out {output} --workers {threads} > {log} 2>&1"


# Speed-perturbed copies of a training split (audio.speed_perturb) aligned by its trained
# system: the targets of networks with nnet.train.speed_perturb (Kaldi's align_si.sh on train_sp;
# for sat, align_fmllr.sh: the copies' features adapted by the lda's transforms, rule fmllr).
rule align:
    input:
        unpack(lambda wildcards: align_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/align/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "align", system=wildcards.system),
        split=lambda wildcards: perturbed_split(wildcards.train),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("align", "mem_mb", reads="copies"),  # MB (sbatch --mem)
        runtime=job_resource("align", "runtime", reads="copies"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    priority: 10
    log:
        f"{RESULTS}/logs/align.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/align.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow align --config {params.config} --system {wildcards.system} --gmm {input.gmm}"
        " --split {params.split} --data {input.data} --features {input.features} --lang {input.lang}"
        " --out {output} --workers {threads} > {log} 2>&1"


# The chain tree (nnet.chain): a one-state topology's tied states at one frame in frame_subsampling,
# built from the source GMM's alignments (of the speed-perturbed copies when a network on it trains
# on them) and those alignments converted to it (Kaldi's steps/nnet3/chain/build_tree.sh). Hybrids
# with alignments: chain train on it; rule graph builds its HCLG like a GMM's.
rule chain:
    input:
        unpack(lambda wildcards: chain_inputs(config, wildcards.train)),
    output:
        directory(f"{RESULTS}/gmm/{{train}}/{CHAIN}"),
    wildcard_constraints:
        train="[^/]*train",
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "chain"),
        split=lambda wildcards: chain_split(config, wildcards.train),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("chain", "mem_mb", reads="copies"),  # MB (sbatch --mem)
        runtime=job_resource("chain", "runtime", reads="copies"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    priority: 10
    log:
        f"{RESULTS}/logs/chain.{{train}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/chain.{{train}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow chain --config {params.config} --source {input.source} --alignments {input.alignments}"
        " --split {params.split} --data {input.data} --features {input.features} --lang {input.lang}"
        " --out {output} --workers {threads} > {log} 2>&1"


# Speaker-adapted features (nnet.features or a network's features: fmllr): one fMLLR transform
# per speaker of the training split (from its alignments), of its speed-perturbed copies, and
# of its test splits (from first-pass hypotheses), written as a feature kind (Kaldi's
# align_fmllr.sh / decode_fmllr.sh / make_fmllr_feats.sh). For sat, every transform starts
# from the tri's and is re-estimated against the sat model.
rule fmllr:
    input:
        unpack(lambda wildcards: fmllr_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/fmllr/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "fmllr", system=wildcards.system),
        optional=lambda wildcards, input: optional_args(input, "alignments", "init"),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("fmllr", "mem_mb"),  # MB (sbatch --mem)
        runtime=job_resource("fmllr", "runtime"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    priority: 10
    log:
        f"{RESULTS}/logs/fmllr.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/fmllr.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow fmllr --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --gmm {input.gmm} --graph {input.graph} --data {input.data} --features {input.features}"
        " --lang {input.lang} {params.optional} --out {output} --workers {threads} > {log} 2>&1"
