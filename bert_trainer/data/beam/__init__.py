"""create_pretraining_data on Apache Beam: `--runner=DirectRunner|SparkRunner|FlinkRunner|...`.

The pipeline (`pipeline.py`) makes the same chunks of documents as the local path, runs the
same per-chunk function on them (the objective's, passed in by its family's corpus writer:
masked LM's `make_chunk`, causal LM's `chunk_stream`), and writes the same shards in the same
order, so its output is byte for byte the local output for the same seed and inputs. This
module only names the runners and checks that Apache Beam is installed: it does not import
Beam (an optional extra).
"""

import logging
import shlex

from bert_trainer.errors import UserError

LOCAL = "local"  # This machine's processes (`chunk_workers`), no Beam.
# Beam runners we pass the pipeline to; their own options come through `beam_options`.
BEAM_RUNNERS = ("DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner",
                "PortableRunner")
RUNNERS = (LOCAL, *BEAM_RUNNERS)
INSTALL = "pip install 'bert-trainer[beam]'"
# Runners whose workers share no file system with the launching machine: the inputs, the
# vocabulary and the output (with its staging directory) must be on Cloud Storage (gs://),
# which every path goes through with `tf.io.gfile`. Local paths are refused up front rather
# than failing on the workers after the job is submitted.
NEEDS_OBJECT_STORAGE = {"DataflowRunner": "gs://"}
DATAFLOW_INSTALL = "pip install 'apache-beam[gcp]==2.77.0'"


def check_runner(runner: str, beam_options=(), import_beam: bool = True) -> list[str]:
    """Validates `runner` and, for a Beam runner, that Beam imports; returns its options.

    Args:
      runner: "local" or one of `BEAM_RUNNERS`.
      beam_options: Beam pipeline options, one string ("--project=p --region=r", split like a
        shell command line) or a list of arguments.
      import_beam: also check that Apache Beam imports (for a Beam runner).

    Returns:
      The pipeline options as a list of arguments.

    Raises:
      UserError: an unknown runner, Beam options without a Beam runner, or Apache Beam not
        installed (the message names the pip command).
    """
    if runner not in RUNNERS:
        raise UserError(f"--runner={runner} is unknown; use one of {', '.join(RUNNERS)}")
    if isinstance(beam_options, str):
        try:
            beam_options = shlex.split(beam_options)
        except ValueError as e:
            raise UserError(f"--beam_options cannot be split into arguments ({e})") from None
    beam_options = list(beam_options)
    if runner == LOCAL:
        if beam_options:
            raise UserError("--beam_options apply to a Beam --runner (e.g. "
                            "--runner=DirectRunner); drop them or pick a runner")
        return beam_options
    bad = [o for o in beam_options if not o.startswith("-")]
    if bad:
        raise UserError(f"--beam_options: '{bad[0]}' is not an option; pass Beam's flags, e.g. "
                        "--beam_options='--project=P --region=R --temp_location=gs://B/tmp'")
    if any(o == "--runner" or o.startswith("--runner=") for o in beam_options):
        raise UserError("--beam_options must not hold --runner; pass it as "
                        "create_pretraining_data's own --runner")
    if not import_beam:
        return beam_options
    # Beam's import warns on the root logger about Google Cloud clients that only
    # DataflowRunner's BigQuery connectors use.
    quiet = _DropRecords()
    logging.root.addFilter(quiet)
    try:
        import apache_beam  # noqa: F401, PLC0415 (an optional extra)
    except ImportError:
        raise UserError(f"--runner={runner} needs Apache Beam, which is not installed: "
                        f"{INSTALL}") from None
    finally:
        logging.root.removeFilter(quiet)
    return beam_options


def check_paths(runner: str, inputs, vocab_file: str, output: str) -> None:
    """Refuses paths the runner's workers cannot see (DataflowRunner: anything not on gs://).

    Args:
      runner: the --runner.
      inputs: --input (a comma list / globs, or a list of them).
      vocab_file, output: --vocab and --output.

    Raises:
      UserError: a path is local for a runner whose workers share no file system with this
        machine; or DataflowRunner without Beam's Google Cloud extra.
    """
    scheme = NEEDS_OBJECT_STORAGE.get(runner)
    if scheme is None:
        return
    parts = [inputs] if isinstance(inputs, str) else list(inputs)
    paths = [("--input", p.strip()) for part in parts for p in str(part).split(",")
             if p.strip()]
    for flag, path in [*paths, ("--vocab", str(vocab_file)), ("--output", str(output))]:
        if not path.startswith(scheme):
            raise UserError(f"--runner={runner}: {flag}={path} is not on {scheme}, and "
                            f"{runner}'s workers cannot see this machine's files; put --input, "
                            f"--vocab and --output on Cloud Storage ({scheme}BUCKET/...)")
    try:
        import apache_beam.runners.dataflow.internal.apiclient  # noqa: F401, PLC0415
    except ImportError:
        raise UserError(f"--runner={runner} needs Beam's Google Cloud extra, which is not "
                        f"installed: {DATAFLOW_INSTALL}") from None


class _DropRecords(logging.Filter):
    def filter(self, record):
        return False
