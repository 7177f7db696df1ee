# Decoding graphs (HCLG per GMM system, TLG per training split for CTC over phones) and
# decoding of the test splits on Dask: GMM-HMMs and hybrid networks through HCLG, CTC
# networks over phones through TLG, other CTC networks by prefix beam search.
# Decoder settings (acoustic scale, insertion penalty; LM weight and word bonus for CTC) are
# first tuned on the networks' held-out training utterances (nnet.decode.tune, decode.tune for
# the GMMs), never on a test set.


rule graph:
    input:
        lang=f"{RESULTS}/lang/{{train}}",
        model=f"{RESULTS}/gmm/{{train}}/{{system}}",
    output:
        directory(f"{RESULTS}/graph/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS + (CHAIN,)),
    priority: 10
    log:
        f"{RESULTS}/logs/graph.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/graph.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow graph --lang {input.lang} --model {input.model} --out {output} > {log} 2>&1"


# The HCLG of the held-out LM (rule lang_heldout) for a GMM's tree: every system decoded through
# that tree (the GMM, its _fmllr, the hybrids on its alignments) tunes with it.
rule graph_heldout:
    input:
        lang=f"{RESULTS}/lang/{{train}}_heldout",
        model=f"{RESULTS}/gmm/{{train}}/{{system}}",
    output:
        directory(f"{RESULTS}/graph/{{train}}_heldout/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS + (CHAIN,)),
    log:
        f"{RESULTS}/logs/graph.{{train}}_heldout.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/graph.{{train}}_heldout.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow graph --lang {input.lang} --model {input.model} --out {output} > {log} 2>&1"


# TLG for CTC over phones: of the training split's lang for the test sets, of its held-out LM's lang
# (train_heldout) for tuning, which every such network of the split shares.
rule graph_ctc:
    input:
        lang=f"{RESULTS}/lang/{{train}}",
    output:
        directory(f"{RESULTS}/graph/{{train}}/tlg"),
    wildcard_constraints:
        train="[^/]*train(_heldout)?",
    log:
        f"{RESULTS}/logs/graph.{{train}}.tlg.log",
    benchmark:
        f"{RESULTS}/benchmarks/graph.{{train}}.tlg.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow graph --lang {input.lang} --ctc --out {output} > {log} 2>&1"


# A GMM system (mono, tri, lda), or one decoded with speaker-adapted features (tri_fmllr, lda_fmllr,
# sat_fmllr: the test speakers' features after the fmllr rule's two passes, Kaldi's decode_fmllr.sh),
# with the setting rule tune_gmm chose for it (decode.tune).
rule decode:
    input:
        unpack(lambda wildcards: gmm_decode_inputs(config, wildcards.test, wildcards.system)),
    output:
        directory(f"{RESULTS}/decode/{{system}}/{{test}}"),
    wildcard_constraints:
        test="[^/]*test",
        system=system_pattern(GMM_SYSTEMS + FMLLR_SYSTEMS),
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "decode"),
        optional=lambda wildcards, input: optional_args(input, "tune"),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("decode", "mem_mb", reads="test"),  # MB (sbatch --mem)
        runtime=job_resource("decode", "runtime", reads="test"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    log:
        f"{RESULTS}/logs/decode.{{system}}.{{test}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/decode.{{system}}.{{test}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow decode --config {params.config} --system {wildcards.system} --test {wildcards.test}"
        " --model {input.model} --graph {input.graph} --data {input.data} --features {input.features}"
        " --lang {input.lang} {params.optional} --out {output} --workers {threads} > {log} 2>&1"


rule decode_nnet:
    input:
        unpack(lambda wildcards: nnet_decode_inputs(config, wildcards.test, wildcards.system)),
    output:
        directory(f"{RESULTS}/decode/{{system}}/{{test}}"),
    wildcard_constraints:
        test="[^/]*test",
        system=system_pattern(network_systems(config)),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: decode_nnet_fingerprint(config, wildcards.system),
        optional=lambda wildcards, input: optional_args(input, "gmm", "graph", "tune"),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("decode", "mem_mb", reads="test"),  # MB (sbatch --mem)
        runtime=job_resource("decode", "runtime", reads="test"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
        gres=lambda wildcards: decode_gres(config, wildcards.system),  # a GPU with nnet.decode.device: cuda
    log:
        f"{RESULTS}/logs/decode.{{system}}.{{test}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/decode.{{system}}.{{test}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow decode --config {params.config} --system {wildcards.system} --test {wildcards.test}"
        " --model {input.model} --data {input.data} --features {input.features} --lang {input.lang}"
        " {params.optional} --out {output} --workers {threads} > {log} 2>&1"


rule tune_nnet:
    input:
        unpack(lambda wildcards: nnet_tune_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/tune/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(tuned_networks(config)),
    params:
        config=RESOLVED,
        fingerprint=lambda wildcards: stage_fingerprint(config, "tune", system=wildcards.system),
        optional=lambda wildcards, input: optional_args(input, "gmm", "graph", "heldout_lang", "heldout_graph"),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("tune", "mem_mb", reads="train"),  # MB (sbatch --mem)
        runtime=job_resource("tune", "runtime", reads="train"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
        gres=lambda wildcards: decode_gres(config, wildcards.system),  # a GPU with nnet.decode.device: cuda
    log:
        f"{RESULTS}/logs/tune.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/tune.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow tune --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --model {input.model} --data {input.data} --features {input.features} --lang {input.lang}"
        " {params.optional} --out {output} --workers {threads} > {log} 2>&1"


# The GMMs' decoder settings (decode.tune), chosen as the networks' are, on the same held-out
# utterances with the LM that has not seen them.
rule tune_gmm:
    input:
        unpack(lambda wildcards: gmm_tune_inputs(config, wildcards.train, wildcards.system)),
    output:
        directory(f"{RESULTS}/tune/{{train}}/{{system}}"),
    wildcard_constraints:
        train="[^/]*train",
        system=system_pattern(GMM_SYSTEMS + FMLLR_SYSTEMS),
    params:
        config=RESOLVED,
        fingerprint=stage_fingerprint(config, "tune_gmm"),
    threads: dask_threads(config, CORES)
    resources:
        mem_mb=job_resource("tune", "mem_mb", reads="train"),  # MB (sbatch --mem)
        runtime=job_resource("tune", "runtime", reads="train"),  # minutes (sbatch -t): asrflow.workflow.JOB_COSTS
    log:
        f"{RESULTS}/logs/tune.{{train}}.{{system}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/tune.{{train}}.{{system}}.tsv"
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow tune --config {params.config} --system {wildcards.system} --train {wildcards.train}"
        " --model {input.model} --data {input.data} --features {input.features} --lang {input.lang}"
        " --heldout-lang {input.heldout_lang} --heldout-graph {input.heldout_graph}"
        " --out {output} --workers {threads} > {log} 2>&1"
