"""Start a training job's learner processes: ``torchrun`` on one node, ``srun`` + ``torchrun`` across nodes.

``asrflow launch --learners 8 --nodes 2 -- asrflow nnet ...`` runs, inside a Slurm allocation,
one ``torchrun`` per node through ``srun`` (one task per node), each starting
``learners / nodes`` learner processes; they meet at a c10d rendezvous on the allocation's
first node, so every parallel strategy's process group spans the nodes. On one node it is
plain ``torchrun`` with a rendezvous on 127.0.0.1 (gloo on CPU, NCCL on GPU in either case).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

LAUNCHERS = ("auto", "torchrun", "srun")


class LaunchError(RuntimeError):
    """The learners cannot be started as configured; the message says why and what to change."""


def per_node(learners: int, nodes: int) -> int:
    """Learner processes per node (``torchrun --nproc-per-node``); ``learners`` must fill the nodes evenly."""
    if nodes < 1 or learners < 1:
        raise LaunchError(f"learners ({learners}) and nodes ({nodes}) must be at least 1")
    if learners % nodes:
        raise LaunchError(f"{learners} learners do not divide evenly over {nodes} nodes "
                          "(nnet.parallel.learners must be a multiple of nnet.parallel.nodes)")
    return learners // nodes


def choose(launcher: str, nodes: int) -> str:
    """``torchrun`` or ``srun``: ``auto`` takes srun exactly when the learners span several nodes."""
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r} (one of {', '.join(LAUNCHERS)})")
    if launcher == "auto":
        return "srun" if nodes > 1 else "torchrun"
    if launcher == "torchrun" and nodes > 1:
        raise LaunchError(f"{nodes} nodes need the srun launcher (nnet.parallel.launcher: auto or srun)")
    return launcher


def rendezvous_port(env: Mapping[str, str], port: int | None) -> int:
    """The configured port, else one derived from the Slurm job id (jobs sharing a node differ)."""
    if port:
        return port
    return 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000


def torchrun_args(nproc: int, nnodes: int = 1, endpoint: str = "127.0.0.1:0", run_id: str = "none") -> list[str]:
    """``torchrun`` with a c10d rendezvous at ``endpoint``; the training command follows ``--no-python``."""
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--no-python"]


def srun_args(nodes: int, env: Mapping[str, str]) -> list[str]:
    """``srun`` with one task per node of the allocation, sharing the CPUs (and GPUs) the job holds.

    ``--overlap`` lets the step run beside a step already holding the allocation (Snakemake's
    Slurm executor runs each job inside ``srun -n1``); CPUs and GPUs per node are passed on
    explicitly, because steps do not inherit them from the batch job since Slurm 22.05.
    """
    args = ["srun", "--nodes", str(nodes), "--ntasks", str(nodes), "--ntasks-per-node", "1", "--overlap",
            "--kill-on-bad-exit=1"]
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE")
    if cpus:
        args.append(f"--cpus-per-task={cpus.split('(')[0]}")
    gpus = env.get("SLURM_GPUS_PER_NODE")
    if gpus:
        args.append(f"--gpus-per-node={gpus}")
    return args


def _split_top(text: str) -> list[str]:
    """Split ``text`` at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_range(spec: str) -> list[str]:
    """``01-03,7`` → ``01 02 03 7`` (zero padding kept)."""
    names = []
    for item in spec.split(","):
        low, _, high = item.partition("-")
        if not high:
            names.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        names += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return names


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a Slurm node list: ``gpu[01-03,07],login1`` → gpu01 gpu02 gpu03 gpu07 login1."""
    hosts = []
    for part in _split_top(nodelist.strip()):
        if "[" not in part:
            hosts.append(part)
            continue
        head, rest = part.split("[", 1)
        spec, tail = rest.split("]", 1)
        hosts += [head + name + more for name in _expand_range(spec) for more in (expand_nodelist(tail) or [""])]
    return hosts


def allocation(env: Mapping[str, str], nodes: int) -> list[str]:
    """Host names of the Slurm allocation this runs in; at least ``nodes`` of them."""
    if not env.get("SLURM_JOB_ID"):
        raise LaunchError(f"starting learners with srun ({nodes} node(s)) needs a Slurm allocation: run the "
                          "workflow with `snakemake --profile cluster`, or set nnet.parallel.nodes: 1 and "
                          "nnet.parallel.launcher: auto to train on this machine")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        hosts = expand_nodelist(nodelist)
    except ValueError as err:
        raise LaunchError(f"cannot read the node list {nodelist!r} of Slurm job {env['SLURM_JOB_ID']}: {err}") from err
    if len(hosts) < nodes:
        raise LaunchError(f"Slurm job {env['SLURM_JOB_ID']} has {len(hosts)} node(s) ({nodelist or 'none'}) but "
                          f"nnet.parallel.nodes is {nodes}: ask for them with the rule's `nodes` resource")
    return hosts


def launch_command(command: Sequence[str], learners: int, nodes: int = 1, launcher: str = "auto",
                   port: int | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The full command line that starts ``learners`` processes of ``command`` over ``nodes`` nodes."""
    env = os.environ if env is None else env
    nproc = per_node(learners, nodes)
    how = choose(launcher, nodes)
    if how == "torchrun":
        return [*torchrun_args(nproc), *command]
    hosts = allocation(env, nodes)
    endpoint = f"{hosts[0]}:{rendezvous_port(env, port)}"
    run_id = f"asrflow-{env['SLURM_JOB_ID']}"
    return [*srun_args(nodes, env), *torchrun_args(nproc, nodes, endpoint, run_id), *command]


def launch_settings(config_path: str, system: str) -> dict:
    """``nnet.parallel`` of a resolved config file with network ``system``'s overrides.

    Read by the launcher itself rather than passed by the rule as params, so that where the
    learners run never makes Snakemake rerun the training (params are a rerun trigger).
    """
    import yaml

    from asrflow.config.schema import YAML_LOADER
    from asrflow.workflow import parallel_settings

    with open(config_path, encoding="utf-8") as handle:
        config = yaml.load(handle, Loader=YAML_LOADER)
    if system not in config.get("nnet", {}).get("models", {}):
        raise LaunchError(f"{system!r} is not a network of nnet.models in {config_path}")
    return parallel_settings(config, system)


def main(argv: Sequence[str] | None = None) -> int:
    """``asrflow launch [options] -- COMMAND...``: print the launch command, then become it."""
    parser = argparse.ArgumentParser(prog="asrflow launch", description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=1, help="learner processes in all")
    parser.add_argument("--nodes", type=int, default=1, help="nodes they span (one torchrun per node)")
    parser.add_argument("--launcher", default="auto", choices=LAUNCHERS)
    parser.add_argument("--port", type=int, default=None, help="rendezvous port on the first node (srun)")
    parser.add_argument("--config", help="a resolved config: take the four settings above from its "
                        "nnet.parallel (with --system's overrides) instead")
    parser.add_argument("--system", help="with --config: the network of nnet.models")
    parser.add_argument("--dry-run", action="store_true", help="print the command and stop")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no training command after --")
    if args.config and not args.system:
        parser.error("--config needs --system")
    try:
        if args.config:
            settings = launch_settings(args.config, args.system)
            args.learners, args.nodes, args.launcher, args.port = (settings[k] for k in ("learners", "nodes",
                                                                                         "launcher", "port"))
        line = launch_command(command, args.learners, args.nodes, args.launcher, args.port)
    except (LaunchError, OSError) as err:
        print(f"asrflow: error: {err}", file=sys.stderr)
        return 1
    print(f"asrflow launch: {shlex.join(line)}", file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    os.execvp(line[0], line)
    return 1  # pragma: no cover - execvp does not return
