"""The yesno experiment through ``snakemake --profile cluster`` on a real Slurm (workflow/slurm/up.sh).

The test brings up a single-node Slurm on 127.0.0.1 (installing it from Debian packages when
missing, as root), runs the workflow with the repository's profile — every job but the light
local rules (graphs, scoring, the comparison) submitted with ``sbatch``, the Dask stages'
workers as Slurm jobs of their own, training on the ``gpu`` partition through ``srun`` +
``torchrun`` — and checks it scores exactly as the local run, which computes meanwhile.
The tear-down stops only the daemons up.sh started, by PID.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.snakemake_run import REPO, YESNO, snakemake

pytestmark = [pytest.mark.workflow, pytest.mark.slurm, pytest.mark.xdist_group("workflow")]

STATE = Path(os.environ.get("ASRFLOW_SLURM_STATE", "/tmp/asrflow-slurm"))
# What the yesno run on Slurm scores: the monophone and the two-learner ring DNN (trained on the triphone's
# alignments, decoded through its graph); the other systems go through the same rules, and the local run covers them.
SYSTEMS = ("mono", "dnn")
OVERLAY = f"""\
dask: {{cluster: slurm, workers: 2, slurm: {{start_timeout: 300}}}}
nnet: {{threads: 2, parallel: {{launcher: srun}}}}   # through srun even on one node, as a multi-node job would
evaluation: {{systems: [{', '.join(SYSTEMS)}]}}
"""


def _slurm_script(name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASRFLOW_SLURM_STATE=str(STATE), ASRFLOW_SLURM_CPUS="8")
    return subprocess.run(["bash", str(REPO / "workflow" / "slurm" / name)], env=env, capture_output=True,
                          text=True, timeout=600)


def _bring_up_and_run(workdir: Path) -> str:
    """up.sh, then the yesno experiment through the cluster profile in ``workdir``: Snakemake's output."""
    started = _slurm_script("up.sh")
    if started.returncode != 0:
        pytest.fail(f"workflow/slurm/up.sh failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")
    overlay = workdir / "on_slurm.yaml"
    overlay.write_text(OVERLAY)
    # Status checks: the plugin waits its initial interval (the profile's 10 s) after a job ends,
    # then 10 s longer after each check that finds nothing finished (10, 30, 60 s, ...), so a
    # 15-s job was seen after ~40 s. yesno's jobs take 10-25 s: 6 s gives checks at 6, 22, 48 s.
    proc = snakemake(workdir, "--profile", str(REPO / "cluster"), "--configfile", str(YESNO), str(overlay),
                     "--slurm-init-seconds-before-status-checks", "6")
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, mirror, request) -> Iterator[tuple[Path, str]]:
    """The yesno experiment through the cluster profile on a running local Slurm (node localhost,
    8 CPU slots, partitions cpu and gpu): its working folder and Snakemake's output.

    Bringing Slurm up (installing it the first time) and the cluster run mostly wait on package
    downloads, sbatch and status checks, so they go on in a thread while the local run
    (``yesno_run``, which the results are compared with) computes.
    """
    if os.geteuid() != 0 and not shutil.which("sudo"):
        message = "bringing up Slurm needs root (apt-get, munged, slurmd)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    workdir = tmp_path_factory.mktemp("slurm")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    cluster = pool.submit(_bring_up_and_run, workdir)  # a failure there comes back from result()
    try:
        try:
            request.getfixturevalue("yesno_run")  # the local run, meanwhile
        finally:
            output = cluster.result()  # the thread is waited for whatever happened
            pool.shutdown()
        yield workdir, output
    finally:
        stopped = _slurm_script("down.sh")
        assert stopped.returncode == 0, stopped.stderr


def finished_jobs(state: Path) -> dict[str, dict[str, str]]:
    """Slurm's job-completion log (jobcomp/filetxt): job id → its fields (Name, Partition, JobState, …)."""
    jobs = {}
    for line in (state / "log" / "jobcomp.log").read_text().splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        jobs[fields["JobId"]] = fields
    return jobs


def submitted(output: str) -> dict[str, str]:
    """Slurm job id → rule, from the executor's 'submitted with SLURM jobid N (log: …/rule_R/…)' lines."""
    return dict(re.findall(r"SLURM jobid (\d+) \(log: \S*?/rule_(\w+)/", output))


def test_same_results_as_the_local_run(slurm_run: tuple[Path, str], request: pytest.FixtureRequest) -> None:
    workdir, _ = slurm_run
    # Asked for here, not as an argument: pytest would set the session-scoped yesno_run up before
    # slurm_run, and the two runs would not overlap. slurm_run has already made it.
    yesno_run = request.getfixturevalue("yesno_run")
    for system in SYSTEMS:
        local = json.loads((yesno_run / "results" / "yesno" / "score" / system / "test.json").read_text())
        remote = json.loads((workdir / "results" / "yesno" / "score" / system / "test.json").read_text())
        for key in ("wer", "errors", "sub", "del", "ins", "n_ref_words"):
            assert remote[key] == local[key], (system, key, remote[key], local[key])
    assert (workdir / "results" / "yesno" / "compare" / "table.md").is_file()


def test_jobs_went_through_sbatch_to_their_partitions(slurm_run: tuple[Path, str]) -> None:
    workdir, output = slurm_run
    jobs = finished_jobs(STATE)
    rules = submitted(output)
    assert {"data", "features", "gmm", "nnet", "decode", "decode_nnet"} <= set(rules.values()), output[-3000:]
    assert not {"graph", "score", "compare"} & set(rules.values())  # localrules: run beside Snakemake
    for job_id, rule in rules.items():
        assert jobs[job_id]["JobState"] == "COMPLETED", (rule, jobs[job_id])
        assert jobs[job_id]["WorkDir"] == str(workdir)
        assert jobs[job_id]["Partition"] == ("gpu" if rule == "nnet" else "cpu"), (rule, jobs[job_id])
    dnn = next(j for j, r in rules.items() if r == "nnet")
    assert int(jobs[dnn]["ProcCnt"]) == 2  # --cpus-per-task = the rule's threads


def test_dask_workers_were_slurm_jobs(slurm_run: tuple[Path, str]) -> None:
    workdir, _ = slurm_run
    jobs = finished_jobs(STATE)
    logs = workdir / "results" / "yesno" / "logs"
    for stage in ("data", "features.mfcc", "features.fbank", "gmm.train.mono", "gmm.train.tri", "decode.mono.test"):
        text = (logs / f"{stage}.log").read_text()
        found = re.search(r"Dask workers are Slurm jobs on partition cpu: ([\d ]+)", text)
        assert found, (stage, text[-2000:])
        for job_id in found.group(1).split():
            assert jobs[job_id]["Name"] == "asrflow-dask" and jobs[job_id]["Partition"] == "cpu", jobs[job_id]
        assert "Dask scheduler tcp://127.0.0.1:" in text  # the scheduler stays on loopback
    assert list((workdir / ".snakemake" / "slurm_logs" / "dask").iterdir())  # the worker jobs' output
    assert not list(workdir.glob("slurm-*.out"))  # none left in the working directory


def test_training_ran_through_srun_and_torchrun(slurm_run: tuple[Path, str]) -> None:
    workdir, _ = slurm_run
    res = workdir / "results" / "yesno"
    log = (res / "logs" / "nnet.train.dnn.log").read_text()
    assert re.search(r"asrflow launch: srun --nodes 1 --ntasks 1 --ntasks-per-node 1 .* torchrun --nnodes 1 "
                     r"--nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:\d+", log), log[:2000]
    manifest = json.loads((res / "nnet" / "train" / "dnn" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["strategy"] == "ring"
