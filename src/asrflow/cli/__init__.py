"""The ``asrflow`` command line: a thin layer over the library, one sub-command per stage.

Snakemake rules call these; each prints a clear ``asrflow: error: ...`` line (and exits
non-zero) for the faults a user can make, instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys

from asrflow.cli.common import EXIT_USAGE
from asrflow.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    """The ``asrflow`` parser: each group module adds its sub-commands (in the order ``--help`` lists them)."""
    from asrflow.cli import bench, data, decode, gmm, nnet, parallel, report

    parser = argparse.ArgumentParser(prog="asrflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data.register(sub)
    gmm.register(sub)
    decode.register_graph(sub)
    nnet.register(sub)
    decode.register(sub)
    report.register(sub)
    benches = bench.register(sub)
    sub.add_parser("launch", help="start a training command's learners: torchrun, or srun + torchrun across nodes "
                   "(asrflow launch --learners N --nodes M -- asrflow nnet ...)", add_help=False)

    parallel.register(sub, benches)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``asrflow`` command line on ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    from asrflow.corpus import CorpusError
    from asrflow.corpus.download import DownloadError
    from asrflow.data.audio import AudioError
    from asrflow.data.datadir import DataDirError
    from asrflow.gmm.lda import LdaError
    from asrflow.lang.arpa import ArpaError, LmError
    from asrflow.lang.lexicon import LexiconError
    from asrflow.nnet import NnetError
    from asrflow.parallel import ParallelError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # its own parser: everything after `--` is the training command
        from asrflow.cluster.launch import main as launch

        return launch(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"asrflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CorpusError, DownloadError, DataDirError, AudioError, LexiconError, ArpaError, LmError, LdaError,
            NnetError, ParallelError, FileNotFoundError) as exc:
        print(f"asrflow: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from asrflow.cluster.client import lost_worker

        if (message := lost_worker(exc)) is None:
            raise
        print(f"asrflow: error: {message}", file=sys.stderr)
        return 1
