# asrflow: corpus → data dirs → features (→ GMM-HMM → neural AMs → decode → score).
# Rules say what runs; profiles (cluster/) say where. Run the default experiment with
#   snakemake --cores all
# and another with --configfile config/experiments/<name>.yaml.
from asrflow.config import CHAIN, FMLLR_SYSTEMS, GMM_SYSTEMS
from asrflow.data.perturb import perturbed_split
from asrflow.workflow import (
    align_inputs,
    chain_inputs,
    chain_split,
    dask_threads,
    decode_gres,
    decode_nnet_fingerprint,
    ensemble_inputs,
    ensemble_systems,
    fmllr_inputs,
    gmm_decode_inputs,
    gmm_inputs,
    gmm_tune_inputs,
    launch_resources,
    network_systems,
    nnet_threads,
    nnet_decode_inputs,
    nnet_tune_inputs,
    nnet_inputs,
    optional_args,
    parallel_study_targets,
    per_attempt,
    job_resource,
    compare_targets,
    pipeline_finished,
    pipeline_started,
    results_dir,
    score_targets,
    setup_workflow,
    stage_fingerprint,
    study_args,
    system_pattern,
    tests_of,
    total_cores,
    trained_networks,
    tuned_networks,
    train_split,
)


configfile: f"{workflow.basedir}/config/config.yaml"


# Validate against workflow/schemas/, fill defaults, write results/<exp>/config.yaml.
config, RESOLVED = setup_workflow(config, workflow.overwrite_configfiles)
RESULTS = results_dir(config)
# --cores; the machine's CPUs for commands that run no job (--unlock after a killed run)
CORES = total_cores(workflow)


include: "rules/data.smk"
include: "rules/features.smk"
include: "rules/lang.smk"
include: "rules/gmm.smk"
include: "rules/nnet.smk"
include: "rules/decode.smk"
include: "rules/score.smk"
include: "rules/report.smk"

# Among ready jobs Snakemake starts the set of the highest total `priority:` that fits the free
# cores. The GMM side (gmm, align, fmllr and their graphs: 10) gates every hybrid network, so
# it goes before any set of smaller jobs; training (nnet, ensemble: 1) gates tuning, decoding
# and scoring (0). The longest chain then starts as early as it can.
#
# Rules that take seconds run where Snakemake runs, never queued on a cluster (as Kaldi's
# recipes make graphs and score on the head node).
localrules:
    all,
    graph,
    graph_heldout,
    graph_ctc,
    score,
    compare,


report: "workflow/report/workflow.rst"


rule all:
    input:
        f"{RESULTS}/data",
        expand(f"{RESULTS}/features/{{kind}}", kind=config["features"]["kinds"]),
        score_targets(config),
        compare_targets(config),
        parallel_study_targets(config),
    default_target: True


onstart:
    pipeline_started(config)


onsuccess:
    pipeline_finished(config, ok=True)


onerror:
    pipeline_finished(config, ok=False)
