"""How a training job's learners are started (asrflow launch) and what the Slurm job asks for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asrflow.cluster.client import slurm_options
from asrflow.cluster.launch import LaunchError, expand_nodelist, launch_command, per_node, rendezvous_port
from asrflow.workflow import (
    JOB_COSTS,
    dask_threads,
    decode_gres,
    job_resource,
    launch_resources,
    per_attempt,
    stage_fingerprint,
)
from tests.conftest import make_config

TRAIN = ["asrflow", "nnet", "--system", "dnn"]


def test_one_node_is_plain_torchrun_on_loopback() -> None:
    line = launch_command(TRAIN, learners=2, env={})
    assert line == ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", "none", "--no-python", *TRAIN]


def test_several_nodes_start_one_torchrun_per_node_with_srun() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_CPUS_PER_TASK": "8",
           "SLURM_GPUS_PER_NODE": "4"}
    line = launch_command(TRAIN, learners=4, nodes=1, launcher="srun", env=env)
    assert line[:line.index("torchrun")] == ["srun", "--nodes", "1", "--ntasks", "1", "--ntasks-per-node", "1",
                                             "--overlap", "--kill-on-bad-exit=1", "--cpus-per-task=8",
                                             "--gpus-per-node=4"]
    torchrun = line[line.index("torchrun"):]
    assert torchrun[:torchrun.index("--no-python")] == [
        "torchrun", "--nnodes", "1", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"localhost:{20000 + 4242}", "--rdzv-id", "asrflow-4242"]
    assert line[-len(TRAIN):] == TRAIN
    with pytest.raises(LaunchError, match="has 1 node"):
        launch_command(TRAIN, learners=4, nodes=2, env=env)  # auto takes srun; the allocation is too small


def test_node_lists_expand_as_slurm_writes_them() -> None:
    assert expand_nodelist("localhost") == ["localhost"]
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("r[1-2]-n[8-9]") == ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]
    assert expand_nodelist("node[9-10]") == ["node9", "node10"]
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]"}
    line = launch_command(TRAIN, learners=8, nodes=2, env=env)
    assert line[line.index("--rdzv-endpoint") + 1] == "gpu01:20007" and line[line.index("--nproc-per-node") + 1] == "4"


def test_launch_errors_say_what_to_change() -> None:
    with pytest.raises(LaunchError, match="needs a Slurm allocation"):
        launch_command(TRAIN, learners=4, nodes=2, env={})
    with pytest.raises(LaunchError, match="do not divide evenly over 2 nodes"):
        per_node(3, 2)
    with pytest.raises(LaunchError, match="need the srun launcher"):
        launch_command(TRAIN, learners=4, nodes=2, launcher="torchrun", env={})
    assert rendezvous_port({"SLURM_JOB_ID": "123456"}, None) == 20000 + 123456 % 20000
    assert rendezvous_port({"SLURM_JOB_ID": "1"}, 29500) == 29500


def test_cli_dry_run_prints_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "asrflow.cli", "launch", "--learners", "2", "--dry-run", "--",
                          "asrflow", "nnet"], capture_output=True, text=True, check=True)
    assert "asrflow launch: torchrun --nnodes 1 --nproc-per-node 2" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "asrflow.cli", "launch", "--learners", "2", "--nodes", "2",
                          "--", "true"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert bad.returncode == 1 and "needs a Slurm allocation" in bad.stderr and "Traceback" not in bad.stderr


def test_training_job_resources(tmp_path) -> None:
    config = make_config(tmp_path, nnet={
        "parallel": {"strategy": "ring", "learners": 2},
        "models": {"one": {"type": "dnn"},
                   "wide": {"type": "dnn", "parallel": {"learners": 8, "nodes": 2, "gpus": True}}}})
    assert launch_resources(config, "one") == {"nodes": 1, "tasks": None, "mpi": None, "gres": None,
                                               "tasks_per_gpu": None}
    assert launch_resources(config, "wide") == {"nodes": 2, "tasks": 2, "mpi": "srun", "gres": "gpu:4",
                                                "tasks_per_gpu": 0}


def test_decoding_jobs_ask_for_a_gpu_only_to_decode_on_one(tmp_path) -> None:
    """``nnet.decode.device: cuda`` (for all networks or one) gives the decode and tune jobs ``--gres=gpu:1``."""
    models = {"cpu": {"type": "dnn"}, "auto": {"type": "dnn", "decode": {"device": "auto"}},
              "gpu": {"type": "dnn", "decode": {"device": "cuda"}}}
    config = make_config(tmp_path, nnet={"models": models})
    assert [decode_gres(config, s) for s in ("cpu", "auto", "gpu")] == [None, None, "gpu:1"]
    config = make_config(tmp_path, nnet={"decode": {"device": "cuda"}, "models": {"net": {"type": "dnn"}}})
    assert decode_gres(config, "net") == "gpu:1"


def test_memory_and_time_grow_on_the_retry() -> None:
    assert [per_attempt(4000)(None, attempt) for attempt in (1, 2, 3)] == [4000, 8000, 12000]


def test_memory_and_time_follow_the_hours_of_audio_a_job_reads(tmp_path) -> None:
    """JOB_COSTS: base + per-hour rate × the hours of the splits the job reads (data/manifest.json), the time
    over its threads and times a network's epochs, and all of it doubled on the retry."""
    import json
    from types import SimpleNamespace

    data = tmp_path / "data"
    data.mkdir()
    splits = {"train": {"hours": 100.0}, "train_sp": {"hours": 300.0}, "test": {"hours": 10.0}}
    (data / "manifest.json").write_text(json.dumps({"splits": splits}))
    files = SimpleNamespace(data=str(data))
    wildcards = SimpleNamespace(train="train", test="test", system="tdnn")
    gmm, decode, fmllr = JOB_COSTS["gmm"], JOB_COSTS["decode"], JOB_COSTS["fmllr"]
    assert job_resource("gmm", "mem_mb", reads="train")(wildcards, files, 2, 1) == gmm.mem_mb[0] + 100 * gmm.mem_mb[1]
    assert job_resource("gmm", "runtime", reads="train")(wildcards, files, 4, 2) == 2 * (
        gmm.minutes[0] + 100 * gmm.minutes[1] / 4)
    assert job_resource("decode", "runtime", reads="test")(wildcards, files, 1, 1) == (
        decode.minutes[0] + 10 * decode.minutes[1])
    assert job_resource("fmllr", "mem_mb")(wildcards, files, 1, 1) == fmllr.mem_mb[0] + 410 * fmllr.mem_mb[1]
    config = make_config(tmp_path, audio={"speed_perturb": [0.9, 1.0, 1.1]},
                         nnet={"models": {"tdnn": {"type": "cnn", "train": {"epochs": 3, "speed_perturb": True}}}})
    nnet = JOB_COSTS["nnet"]
    assert job_resource("nnet", "runtime", reads="network", config=config)(wildcards, files, 1, 1) == (
        nnet.minutes[0] + 300 * 3 * nnet.minutes[1])
    # before the data stage: the error names the job's input as given, which Snakemake takes for "not yet"
    with pytest.raises(FileNotFoundError) as missing:
        job_resource("gmm", "mem_mb", reads="train")(wildcards, SimpleNamespace(data=str(tmp_path / "no")), 1, 1)
    assert missing.value.filename == str(tmp_path / "no")


def test_launch_settings_do_not_retrain(tmp_path) -> None:
    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    moved = make_config(tmp_path, nnet={"parallel": {"launcher": "srun", "gpus": True, "port": 29500},
                                        "models": {"dnn": {"type": "dnn", "parallel": {"nodes": 1}}}})
    changed = make_config(tmp_path, nnet={"parallel": {"strategy": "ring"}, "models": {"dnn": {"type": "dnn"}}})
    faster = make_config(tmp_path, nnet={"train": {"prefetch": 0}, "models": {"dnn": {"type": "dnn",
                                                                                         "train": {"prefetch": 4}}}})
    slower = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {"prefetch": 1, "epochs": 3}}}})
    fingerprint = [stage_fingerprint(c, "nnet", system="dnn") for c in (base, moved, changed, faster, slower)]
    assert fingerprint[0] == fingerprint[1] == fingerprint[3] != fingerprint[2]
    assert fingerprint[4] not in fingerprint[:4]  # epochs beside prefetch still count


def test_learners_must_fill_the_nodes(tmp_path) -> None:
    from asrflow.config import ConfigError

    with pytest.raises(ConfigError, match=r"nnet.models.dnn.parallel': 3 learners do not divide evenly over 2"):
        make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "parallel": {"learners": 3, "nodes": 2}}}})



def test_overlap_is_for_uncompressed_kavg(tmp_path) -> None:
    from asrflow.config import ConfigError

    kavg = {"strategy": "kavg", "learners": 2, "overlap": True}
    assert make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "parallel": kavg}}})
    with pytest.raises(ConfigError, match=r"nnet.models.dnn.parallel': overlap applies to kavg without compression, "
                                          r"not to ring"):
        make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "parallel": {**kavg, "strategy": "ring"}}}})
    with pytest.raises(ConfigError, match="not to kavg with 1bit"):
        make_config(tmp_path, nnet={"parallel": {"compression": "1bit"},
                                    "models": {"dnn": {"type": "dnn", "parallel": kavg}}})


def test_dask_on_slurm_options(tmp_path) -> None:
    config = make_config(tmp_path, dask={"cluster": "slurm", "slurm": {"partition": "short", "memory": "4GB",
                                                                       "job_extra": ["--qos=low"]}})
    options = slurm_options(config["dask"])
    assert options["queue"] == "short" and options["memory"] == "4GB" and options["processes"] == 1
    assert options["job_extra_directives"] == ["--qos=low"] and options["python"] == sys.executable
    assert options["scheduler_options"]["host"] == "127.0.0.1" and "interface" not in options
    assert dask_threads(config, 8) == 1  # the stage's job only holds the scheduler
    with_interface = make_config(tmp_path, dask={"cluster": "slurm", "slurm": {"interface": "lo"}})
    assert slurm_options(with_interface["dask"])["interface"] == "lo"
    assert dask_threads(make_config(tmp_path, dask={"workers": None}), 8) == 8  # a local cluster: every core
    assert dask_threads(make_config(tmp_path), 8) == 1  # make_config's dask.workers 1: one core, jobs side by side


def test_a_networks_job_takes_nnet_threads(tmp_path) -> None:
    """nnet.threads (null: every core) sets the training job's threads; it changes no fingerprint."""
    from asrflow.workflow import nnet_threads

    every, one = make_config(tmp_path), make_config(tmp_path, nnet={"threads": 1})
    assert nnet_threads(every, 8) == 8 and nnet_threads(one, 8) == 1 and nnet_threads(one, 0 + 1) == 1
    for config in (every, one):
        config["nnet"]["models"] = {"dnn": {"type": "dnn"}}
    assert stage_fingerprint(every, "nnet", system="dnn") == stage_fingerprint(one, "nnet", system="dnn")


def test_the_rule_passes_the_config_not_the_launch_settings(tmp_path) -> None:
    """nnet.smk gives asrflow launch the resolved config: its launch settings are no Snakemake params."""
    import yaml

    config = make_config(tmp_path, nnet={"parallel": {"strategy": "ring", "learners": 2},
                                         "models": {"dnn": {"type": "dnn", "parallel": {"learners": 4}}}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "asrflow.cli", "launch", "--config", str(path), "--system", "dnn",
                          "--dry-run", "--", "asrflow", "nnet"], capture_output=True, text=True, check=True)
    assert "torchrun --nnodes 1 --nproc-per-node 4" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "asrflow.cli", "launch", "--config", str(path), "--system", "dnx",
                          "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 1 and "'dnx' is not a network" in bad.stderr and "Traceback" not in bad.stderr


def test_a_null_seed_is_the_experiment_seed_in_the_fingerprint(tmp_path) -> None:
    """nnet.train.seed null inherits the experiment's seed: the same fingerprint as before the key existed."""
    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    same = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {"seed": None}}}})
    other = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {"seed": 5}}}})
    assert base["nnet"]["train"]["seed"] is None
    fingerprint = [stage_fingerprint(c, "nnet", system="dnn") for c in (base, same, other)]
    assert fingerprint[0] == fingerprint[1] != fingerprint[2]


def test_speed_perturbation_switched_off_changes_no_fingerprint(tmp_path) -> None:
    """audio.speed_perturb [] and nnet.train.speed_perturb false rerun nothing that ran before the keys existed."""
    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    off = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {"speed_perturb": False}}}})
    on = make_config(tmp_path, audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.1]},
                     nnet={"models": {"dnn": {"type": "dnn", "train": {"speed_perturb": True}}}})
    assert base["audio"]["speed_perturb"] == [] and base["nnet"]["train"]["speed_perturb"] is False
    for stage, system in (("data", ""), ("nnet", "dnn")):
        fingerprint = [stage_fingerprint(c, stage, system=system) for c in (base, off, on)]
        assert fingerprint[0] == fingerprint[1] != fingerprint[2]


def test_speaker_cmvn_changes_no_fingerprint_and_utterance_cmvn_retrains(tmp_path) -> None:
    """nnet.cmvn at its default (speaker) retrains no network trained before the key existed; per-utterance CMVN,
    for all networks or one, retrains what it applies to."""
    from asrflow.config import model_cmvn

    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    same = make_config(tmp_path, nnet={"cmvn": "speaker", "models": {"dnn": {"type": "dnn"}}})
    every = make_config(tmp_path, nnet={"cmvn": "utterance", "models": {"dnn": {"type": "dnn"}}})
    own = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "cmvn": "utterance"},
                                                 "d2": {"type": "dnn", "cmvn": "utterance"},
                                                 "e": {"type": "ensemble", "members": ["dnn", "d2"]}}})
    assert base["nnet"]["cmvn"] == "speaker" and "cmvn" not in base["nnet"]["models"]["dnn"]
    fingerprint = [stage_fingerprint(c, "nnet", system="dnn") for c in (base, same, every, own)]
    assert fingerprint[0] == fingerprint[1] and len(set(fingerprint[1:])) == 3
    assert [model_cmvn(c, "dnn") for c in (base, every, own)] == ["speaker", "utterance", "utterance"]
    assert model_cmvn(own, "e") == "utterance"  # the members'


@pytest.mark.parametrize(("key", "default", "on"), [
    ("mmi", {"weight": 0.0, "acoustic_scale": 0.1, "denominator": "graph", "phone_lm_order": 3,
             "cross_entropy": "shared", "tolerance": 0}, {"weight": 1.0}),
])
def test_training_options_switched_off_change_no_fingerprint(tmp_path, key: str, default: dict, on: dict) -> None:
    """nnet.train.<key> at its default (off) retrains no network trained before the key existed."""
    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    before = {**base, "nnet": {**base["nnet"], "train": {k: v for k, v in base["nnet"]["train"].items() if k != key}}}
    switched = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {key: on}}}})
    assert base["nnet"]["train"][key] == default
    fingerprint = [stage_fingerprint(c, "nnet", system="dnn") for c in (before, base, switched)]
    assert fingerprint[0] == fingerprint[1] != fingerprint[2]


def test_mmi_keys_added_later_change_no_fingerprint_at_their_defaults(tmp_path) -> None:
    """A network trained with MMI before train.mmi.denominator existed keeps its fingerprint; a phone-LM
    denominator, or another order of it, is a new one."""
    def fingerprint(mmi: dict) -> str:
        config = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "train": {"mmi": mmi}}}})
        if "denominator" not in mmi:  # as the config was before the keys existed
            for section in (config["nnet"]["train"], config["nnet"]["models"]["dnn"]["train"]):
                section["mmi"] = {k: v for k, v in section["mmi"].items() if k in ("weight", "acoustic_scale")}
        return stage_fingerprint(config, "nnet", system="dnn")

    before = fingerprint({"weight": 4.0})
    assert fingerprint({"weight": 4.0, "denominator": "graph", "phone_lm_order": 3}) == before
    phone_lm = fingerprint({"weight": 4.0, "denominator": "phone_lm"})
    assert len({before, phone_lm, fingerprint({"weight": 4.0, "denominator": "phone_lm", "phone_lm_order": 2})}) == 3


def test_a_ctc_model_needs_no_gmm(tmp_path) -> None:
    """CTC networks train, tune and decode without the GMM; hybrids read its alignments and graph."""
    from asrflow.workflow import nnet_decode_inputs, nnet_inputs, nnet_tune_inputs, results_dir

    models = {"c": {"type": "cnn", "objective": "ctc"}, "d": {"type": "dnn"}}
    config = make_config(tmp_path, nnet={"models": models}, evaluation={"systems": list(models)})
    root = results_dir(config)
    for inputs in (nnet_inputs, nnet_tune_inputs):
        assert "gmm" not in inputs(config, "train", "c")
        assert inputs(config, "train", "d")["graph"] == f"{root}/graph/train/tri"
    assert "gmm" not in nnet_decode_inputs(config, "test", "c")


def test_gmm_insertion_penalty_zero_changes_no_fingerprint(tmp_path) -> None:
    """decode.insertion_penalty 0 (the default) reruns no decode, fMLLR or tuning that ran before the key existed."""
    from asrflow.decode.decoder import gmm_decode_options

    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    before = {**base, "decode": {k: v for k, v in base["decode"].items() if k != "insertion_penalty"}}
    on = make_config(tmp_path, decode={"insertion_penalty": 2.0}, nnet={"models": {"dnn": {"type": "dnn"}}})
    assert base["decode"]["insertion_penalty"] == 0.0 and gmm_decode_options(on["decode"]).insertion_penalty == 2.0
    for stage, system in (("decode", ""), ("fmllr", "tri"), ("tune", "dnn"), ("decode_nnet", "dnn")):
        fingerprint = [stage_fingerprint(c, stage, system=system) for c in (before, base, on)]
        assert fingerprint[0] == fingerprint[1] != fingerprint[2], stage


def test_a_monophone_subset_at_its_default_changes_no_fingerprint(tmp_path) -> None:
    """gmm.mono.subset null (all utterances) reruns no monophone trained before the key existed; a subset does."""
    base = make_config(tmp_path)
    before = {**base, "gmm": {**base["gmm"], "mono": {k: v for k, v in base["gmm"]["mono"].items()
                                                     if k not in ("subset", "subset_by")}}}
    on = make_config(tmp_path, gmm={"mono": {"subset": 500}})
    for stage in ("gmm", "align"):
        fingerprint = [stage_fingerprint(c, stage, system="mono") for c in (before, base, on)]
        assert fingerprint[0] == fingerprint[1] != fingerprint[2], stage


def test_gmm_tuning_enters_only_its_own_fingerprint(tmp_path) -> None:
    """decode.tune is read by the GMM tune stage alone: adding or changing it reruns no fMLLR pass, network tuning
    or decode (the GMM decodes read the tune folder as an input instead)."""
    models = {"nnet": {"models": {"dnn": {"type": "dnn"}}}}
    base = make_config(tmp_path, **models)
    before = {**base, "decode": {k: v for k, v in base["decode"].items() if k != "tune"}}
    other = make_config(tmp_path, decode={"tune": {"acoustic_scale": [0.05, 0.1]}}, **models)
    for stage, system in (("decode", ""), ("fmllr", "tri"), ("tune", "dnn"), ("decode_nnet", "dnn")):
        assert len({stage_fingerprint(c, stage, system=system) for c in (before, base, other)}) == 1, stage
    assert stage_fingerprint(base, "tune_gmm") != stage_fingerprint(other, "tune_gmm")


def test_fmllr_networks_read_their_folds_adapted_features(tmp_path) -> None:
    """A network with features: fmllr reads fmllr/<train>/<alignments system>; the fmllr rule adapts the
    speed-perturbed copies only when such a network trains on them."""
    from asrflow.workflow import fmllr_inputs, nnet_inputs, results_dir

    models = {"dnn": {"type": "dnn"}, "dnn_f": {"type": "dnn", "features": "fmllr"},
              "dnn_f2": {"type": "dnn", "features": "fmllr", "train": {"seed": 2}},
              "ens": {"type": "ensemble", "members": ["dnn_f", "dnn_f2"]}}
    config = make_config(tmp_path, features={"kinds": ["mfcc", "fbank"]}, nnet={"models": models},
                         evaluation={"systems": ["tri", "dnn", "ens"]})
    root = results_dir(config)
    assert nnet_inputs(config, "loso_a_train", "dnn")["features"] == f"{root}/features/fbank"
    for system in ("dnn_f", "ens"):
        assert nnet_inputs(config, "loso_a_train", system)["features"] == f"{root}/fmllr/loso_a_train/tri"
    assert fmllr_inputs(config, "train", "tri") == {
        "data": f"{root}/data", "features": f"{root}/features/mfcc", "lang": f"{root}/lang/train",
        "gmm": f"{root}/gmm/train/tri", "graph": f"{root}/graph/train/tri"}
    models["dnn_f"]["train"] = {"speed_perturb": True}
    models["dnn_f2"]["train"] = {"seed": 2, "speed_perturb": True}
    perturbed = make_config(tmp_path, features={"kinds": ["mfcc", "fbank"]}, nnet={"models": models},
                            audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.1]},
                            evaluation={"systems": ["tri", "dnn", "ens"]})
    assert fmllr_inputs(perturbed, "train", "tri")["alignments"] == f"{root}/align/train/tri"


def test_sat_trains_on_the_lda_adapted_features_and_networks_can_use_it(tmp_path) -> None:
    """The chain mono → tri → lda → sat: sat is a GMM trained on fmllr/<train>/lda from the lda alignments,
    adapted from the lda's transforms, decoded as sat_fmllr; a network with alignments: sat trains on its
    targets and (fmllr) features, and with speed_perturb on its alignments of the copies (aligned on their
    lda-adapted features, which the lda's alignments of the copies supervise)."""
    from asrflow.workflow import (
        align_inputs,
        fmllr_inputs,
        gmm_decode_inputs,
        gmm_inputs,
        gmm_tune_inputs,
        nnet_inputs,
        nnet_tune_inputs,
        results_dir,
        stage_fingerprint,
    )

    models = {"dnn": {"type": "dnn", "features": "fmllr"}, "dnn_sat": {"type": "dnn", "features": "fmllr",
                                                                       "alignments": "sat"}}
    config = make_config(tmp_path, nnet={"models": models}, features={"kinds": ["mfcc", "fbank"]},
                         evaluation={"systems": ["tri_fmllr", "sat_fmllr", "dnn", "dnn_sat"]})
    root = results_dir(config)
    assert gmm_inputs(config, "train", "mono") == {"data": f"{root}/data", "features": f"{root}/features/mfcc",
                                                  "lang": f"{root}/lang/train"}
    assert gmm_inputs(config, "train", "tri")["source"] == f"{root}/gmm/train/mono"
    assert gmm_inputs(config, "train", "lda")["source"] == f"{root}/gmm/train/tri"
    assert gmm_inputs(config, "train", "sat") == {"data": f"{root}/data", "features": f"{root}/fmllr/train/lda",
                                                 "lang": f"{root}/lang/train", "source": f"{root}/gmm/train/lda"}
    assert fmllr_inputs(config, "train", "sat")["init"] == f"{root}/fmllr/train/lda"
    assert "init" not in fmllr_inputs(config, "train", "tri") and "alignments" not in fmllr_inputs(config, "train",
                                                                                                     "lda")
    sp_models = {"tdnn": {"type": "cnn", "alignments": "sat", "train": {"speed_perturb": True}}}
    sp = make_config(tmp_path, nnet={"models": sp_models}, audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.1]},
                     features={"kinds": ["mfcc", "fbank"]}, evaluation={"systems": ["tdnn"]})
    assert nnet_inputs(sp, "train", "tdnn")["alignments"] == f"{root}/align/train/sat"
    assert align_inputs(sp, "train", "sat")["features"] == f"{root}/fmllr/train/lda"
    assert align_inputs(sp, "train", "lda")["features"] == f"{root}/features/mfcc"
    assert fmllr_inputs(sp, "train", "lda")["alignments"] == f"{root}/align/train/lda"
    assert "alignments" not in fmllr_inputs(sp, "train", "sat")  # the network reads fbank, not sat's features
    assert gmm_decode_inputs(config, "test", "sat_fmllr") == {
        "data": f"{root}/data", "features": f"{root}/fmllr/train/sat", "lang": f"{root}/lang/train",
        "model": f"{root}/gmm/train/sat", "graph": f"{root}/graph/train/sat", "tune": f"{root}/tune/train/sat_fmllr"}
    # the GMM tune stage reads the training split's adapted features, and the held-out LM's lang and its HCLG
    # for sat's tree, which sat's hybrids tune with too
    assert gmm_tune_inputs(config, "train", "sat_fmllr") == {
        "data": f"{root}/data", "features": f"{root}/fmllr/train/sat", "lang": f"{root}/lang/train",
        "model": f"{root}/gmm/train/sat", "heldout_lang": f"{root}/lang/train_heldout",
        "heldout_graph": f"{root}/graph/train_heldout/sat"}
    assert nnet_tune_inputs(config, "train", "dnn_sat")["heldout_graph"] == f"{root}/graph/train_heldout/sat"
    ctc_models = {"ctc_phone": {"type": "cnn", "objective": "ctc", "units": "phone"},
                  "ctc_bpe": {"type": "cnn", "objective": "ctc", "units": "bpe"}}
    ctc = make_config(tmp_path, nnet={"models": ctc_models}, evaluation={"systems": ["ctc_phone", "ctc_bpe"]})
    assert nnet_tune_inputs(ctc, "train", "ctc_phone")["heldout_graph"] == f"{root}/graph/train_heldout/tlg"
    assert "heldout_graph" not in nnet_tune_inputs(ctc, "train", "ctc_bpe")  # prefix search: no graph
    plain, sat = nnet_inputs(config, "train", "dnn"), nnet_inputs(config, "train", "dnn_sat")
    assert (plain["gmm"], plain["features"]) == (f"{root}/gmm/train/tri", f"{root}/fmllr/train/tri")
    assert (sat["gmm"], sat["graph"], sat["features"]) == (
        f"{root}/gmm/train/sat", f"{root}/graph/train/sat", f"{root}/fmllr/train/sat")
    # each GMM's fingerprint covers its own section only: configuring sat does not retrain tri
    other = make_config(tmp_path, nnet={"models": models}, features={"kinds": ["mfcc", "fbank"]},
                        gmm={"sat": {"leaves": 77}}, evaluation={"systems": ["tri_fmllr", "sat_fmllr"]})
    for stage in ("gmm", "fmllr"):
        assert stage_fingerprint(config, stage, system="tri") == stage_fingerprint(other, stage, system="tri")
        assert stage_fingerprint(config, stage, system="sat") != stage_fingerprint(other, stage, system="sat")


def test_networks_on_the_chain_tree_read_its_targets_graph_and_its_source_s_features(tmp_path) -> None:
    """The chain tree (rule chain, gmm/<train>/chain) is built from its source GMM's alignments of the speed-
    perturbed copies when a network on it trains on them, read with that GMM's features; a network on it takes
    its targets (the copies' too) and HCLG from that folder, the source's fMLLR features, and no priors."""
    from asrflow.config import settings
    from asrflow.workflow import chain_inputs, chain_split, fmllr_inputs, nnet_inputs, nnet_tune_inputs, results_dir

    chain = {"type": "cnn", "channels": [], "subsampling": 3, "alignments": "chain", "features": "fmllr"}
    models = {"tdnn_chain": chain}
    config = make_config(tmp_path, nnet={"models": models, "chain": {"source": "sat"}},
                         features={"kinds": ["mfcc", "fbank"]}, evaluation={"systems": ["tdnn_chain"]})
    root = results_dir(config)
    assert chain_split(config, "train") == "train"
    assert chain_inputs(config, "train") == {
        "data": f"{root}/data", "features": f"{root}/fmllr/train/lda", "lang": f"{root}/lang/train",
        "source": f"{root}/gmm/train/sat", "alignments": f"{root}/gmm/train/sat"}
    inputs = nnet_inputs(config, "train", "tdnn_chain")
    assert (inputs["gmm"], inputs["graph"], inputs["features"]) == (
        f"{root}/gmm/train/chain", f"{root}/graph/train/chain", f"{root}/fmllr/train/sat")
    assert nnet_tune_inputs(config, "train", "tdnn_chain")["heldout_graph"] == f"{root}/graph/train_heldout/chain"
    assert settings.network(config, "tdnn_chain").priors == "none"
    models["tdnn_chain"] = {**chain, "train": {"speed_perturb": True}}
    sp = make_config(tmp_path, nnet={"models": models, "chain": {"source": "sat"}},
                     audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.1]},
                     features={"kinds": ["mfcc", "fbank"]}, evaluation={"systems": ["tdnn_chain"]})
    assert chain_split(sp, "train") == "train_sp"
    assert chain_inputs(sp, "train")["alignments"] == f"{root}/align/train/sat"
    assert nnet_inputs(sp, "train", "tdnn_chain")["alignments"] == f"{root}/gmm/train/chain"
    assert fmllr_inputs(sp, "train", "sat")["alignments"] == f"{root}/align/train/sat"  # the network reads them
    assert fmllr_inputs(sp, "train", "lda")["alignments"] == f"{root}/align/train/lda"  # sat aligns the copies


def test_a_test_set_can_be_paired_with_any_training_split(tmp_path) -> None:
    """evaluation.train_of pairs a test split with a training split its name does not give: its decodes read
    that split's models, its lang reports the test set's OOV rate, and its score that lang."""
    from asrflow.config import ConfigError
    from asrflow.workflow import gmm_decode_inputs, nnet_decode_inputs, results_dir, tests_of, train_split

    config = make_config(tmp_path, corpus={"name": "fsdd", "protocols": ["standard", "loso"]},
                         nnet={"models": {"dnn": {"type": "dnn"}}},
                         evaluation={"systems": ["tri", "dnn"], "test_sets": ["test", "loso_theo_test"],
                                     "train_of": {"loso_theo_test": "train"}})
    root = results_dir(config)
    assert train_split("loso_theo_test", config) == "train" and train_split("loso_theo_test") == "loso_theo_train"
    assert tests_of(config, "train") == ["test", "loso_theo_test"]
    assert nnet_decode_inputs(config, "loso_theo_test", "dnn")["model"] == f"{root}/nnet/train/dnn"
    assert gmm_decode_inputs(config, "loso_theo_test", "tri")["model"] == f"{root}/gmm/train/tri"
    with pytest.raises(ConfigError, match="'evaluation.train_of': dev_test not in evaluation.test_sets"):
        make_config(tmp_path, evaluation={"train_of": {"dev_test": "train"}})


def test_optional_inputs_become_the_cli_s_hyphenated_options() -> None:
    from asrflow.workflow import optional_args

    inputs = {"gmm": "g", "heldout_lang": "l", "heldout_graph": "h"}
    assert optional_args(inputs, "gmm", "graph", "heldout_lang", "heldout_graph") == \
        "--gmm g --heldout-lang l --heldout-graph h"


def test_a_networks_own_decode_settings_rerun_its_decodes_not_its_training(tmp_path, monkeypatch) -> None:
    """``nnet.models.<system>.decode`` (over nnet.decode) is read by the decode and tune stages: changing it reruns
    them and retrains nothing; a network without it keeps the fingerprints of before the key was read."""
    from asrflow import workflow

    base = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn"}}})
    own = make_config(tmp_path, nnet={"models": {"dnn": {"type": "dnn", "decode": {"batch_frames": 20000}}}})
    assert stage_fingerprint(base, "nnet", system="dnn") == stage_fingerprint(own, "nnet", system="dnn")
    for stage in ("decode_nnet", "tune"):
        assert stage_fingerprint(base, stage, system="dnn") != stage_fingerprint(own, stage, system="dnn")
        before = stage_fingerprint(base, stage, system="dnn")
        monkeypatch.setitem(workflow.STAGE_SECTIONS, stage,
                            tuple(k for k in workflow.STAGE_SECTIONS[stage] if k != "nnet.models.{system}.decode"))
        assert stage_fingerprint(base, stage, system="dnn") == before


def test_a_decoder_kinds_settings_rerun_only_the_networks_decoded_that_way(tmp_path) -> None:
    """A setting or tuning list of ``nnet.decode`` that only one decoder kind reads (HCLG, TLG, prefix search)
    reruns the decode and tune stages of the networks decoded that way, not the others'; shared ones rerun all."""
    models = {"dnn": {"type": "dnn"}, "phones": {"type": "cnn", "objective": "ctc", "units": "phone"},
              "bpe": {"type": "cnn", "objective": "ctc", "units": "bpe"}}

    def fingerprints(decode: dict) -> dict[tuple[str, str], str]:
        config = make_config(tmp_path, nnet={"models": models, "decode": decode})
        return {(stage, system): stage_fingerprint(config, stage, system=system)
                for stage in ("decode_nnet", "tune") for system in models}

    base = fingerprints({})
    for decode, changed in (({"tune": {"acoustic_scale": [0.05, 0.1]}}, {"dnn"}),
                            ({"insertion_penalty": 1.0}, {"dnn"}),
                            ({"tune": {"tlg_acoustic_scale": [0.7, 1.0]}}, {"phones"}),
                            ({"tlg_insertion_penalty": -1.0}, {"phones"}),
                            ({"max_active": 900}, {"dnn", "phones"}),
                            ({"tune": {"word_bonus": [0.0, 6.0]}}, {"bpe"}),
                            ({"vocabulary": "closed"}, {"bpe"}),
                            ({"batch_frames": 5000}, {"dnn", "phones", "bpe"}),
                            ({"tune": {"max_utterances": 100}}, {"dnn", "phones", "bpe"})):
        after = fingerprints(decode)
        assert {system for (_, system), value in after.items() if value != base[_, system]} == changed, decode
    own = make_config(tmp_path, nnet={"models": {**models, "bpe": {**models["bpe"], "decode": {
        "acoustic_scale": 0.3, "tune": {"acoustic_scale": [0.3]}}}}})
    assert stage_fingerprint(own, "tune", system="bpe") == base["tune", "bpe"]
