"""``ui``: start the MLflow UI on the project's store and print each experiment's link.

MLflow 3's UI opens an experiment on its GenAI overview unless its global *Model training*
switch is on; the printed links (``...?workflowType=machine_learning``) open *Model training ->
Runs* of each dataset pair directly (``tracking.store.experiment_links``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from transformer_nmt.errors import ConfigError
from transformer_nmt.tracking.store import experiment_links, tracking_uri


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address the UI listens on")
    parser.add_argument("--port", type=int, default=5000, help="port of the UI")
    parser.add_argument(
        "--links-only",
        action="store_true",
        help="print the experiments' links and exit (a UI already runs, or another host serves it)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="the UI's address in the links (default http://<host>:<port>)",
    )


def run(args: argparse.Namespace) -> int:
    uri = tracking_uri()
    url = args.url or f"http://{args.host}:{args.port}"
    links = experiment_links(uri, url)
    print(f"MLflow store: {uri}")
    if not links:
        print("no experiments yet: run the pipeline first (make run)")
    for name, link in links:
        print(f"  {name}: {link}")
    sys.stdout.flush()
    if args.links_only:
        return 0
    mlflow = shutil.which("mlflow")
    if mlflow is None:
        raise ConfigError("no `mlflow` command on PATH: activate the project's environment")
    command = [mlflow, "ui", "--backend-store-uri", uri, "--host", args.host]
    command += ["--port", str(args.port)]
    print("starting:", " ".join(command), "(Ctrl-C stops it)", flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0
