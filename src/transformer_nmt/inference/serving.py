"""The trained model as an MLflow model: a pyfunc flavour wrapping ``translation.Translator``.

``log_translator_model`` logs a pipeline experiment's averaged model into its MLflow run as the
model ``translator`` (artifacts: the model file, the pair's SentencePiece model and the search
settings as JSON; this package's source as code, so the model serves without installing it)
(MLflow's "models from code": ``_mlflow_model.py`` builds the ``TranslatorModel``, no pickle)
and registers it in the model registry, by default under the experiment's name. Then::

    mlflow models serve -m models:/<name>/<version> --env-manager local
    curl -d '{"inputs": ["A man rides a bike."]}' -H 'Content-Type: application/json' \\
        http://127.0.0.1:5000/invocations     # -> {"predictions": ["Ein Mann ..."]}

``predict`` takes a list of source sentences (or one string, or a DataFrame whose ``text``
column, or only column, holds them) and returns one translation per sentence, in order.
The CLI stage is ``register`` (``cli/register.py``). MLflow imports only when this module does.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from transformer_nmt import tracking
from transformer_nmt.errors import DataError
from transformer_nmt.search import SearchSettings

log = logging.getLogger(__name__)

MODEL_NAME = "translator"  # the logged model's name inside the run
INPUT_COLUMN = "text"
DEVICE_ENV = "TRANSFORMER_NMT_DEVICE"  # device of a served model (default auto)
EXAMPLE = "A man is riding a bike."
_MODEL_FILE, _SPM_MODEL, _SETTINGS = "model_file", "spm_model", "search_settings"


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """pyfunc model: source sentences in, translations out (beam search, §6.1 settings)."""

    def load_context(self, context: Any) -> None:
        from transformer_nmt.inference.translator import Translator

        artifacts = context.artifacts
        with open(artifacts[_SETTINGS], encoding="utf-8") as handle:
            settings = SearchSettings(**json.load(handle))
        device = os.environ.get(DEVICE_ENV, "auto")
        self.translator = Translator(
            artifacts[_MODEL_FILE], artifacts[_SPM_MODEL], settings, device
        )

    # No type hints on predict: MLflow 3 would derive a (list-only) input schema from them.
    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201
        return self.translator.translate(source_sentences(model_input))


def source_sentences(model_input: Any) -> list[str]:
    """The sentences of a pyfunc input: a str, a list/array/Series of str, or a DataFrame with
    a ``text`` column (or a single column). Missing values (None, NaN) are empty lines."""
    import pandas as pd

    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        if INPUT_COLUMN in model_input.columns:
            model_input = model_input[INPUT_COLUMN]
        elif len(model_input.columns) == 1:
            model_input = model_input.iloc[:, 0]
        else:
            raise DataError(
                f"model input: expected a {INPUT_COLUMN!r} column of source sentences, got "
                f"columns {list(model_input.columns)}"
            )
    values = list(model_input)
    bad = [v for v in values if not (isinstance(v, str) or v is None or pd.isna(v))]
    if bad:
        raise DataError(f"model input: expected source sentences (str), got {bad[0]!r}")
    return [v if isinstance(v, str) else "" for v in values]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]))


def _requirements() -> list[str]:
    """What a served model imports (explicit: MLflow's inference would load the model twice)."""
    from importlib.metadata import PackageNotFoundError, version

    requirements = []
    for package in ("mlflow", "torch", "sentencepiece", "numpy", "pandas"):
        try:
            requirements.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            requirements.append(package)
    return requirements


def log_translator_model(
    run: tracking.StageRun,
    model_path: str | os.PathLike[str],
    spm_model: str | os.PathLike[str],
    settings: SearchSettings,
    registered_name: str | None,
) -> dict[str, Any]:
    """Log the model into ``run`` as the pyfunc model ``translator`` and register it as
    ``registered_name`` (None: do not register). Returns ``{"model_uri", "registered_name",
    "version", "registered_uri"}`` (the last two None when not registered)."""
    import transformer_nmt

    mlflow.set_tracking_uri(tracking.tracking_uri())
    package_dir = str(Path(transformer_nmt.__file__).resolve().parent)
    with tempfile.TemporaryDirectory(prefix="transformer_nmt-model-") as tmp:
        settings_path = Path(tmp) / "search_settings.json"
        settings_path.write_text(json.dumps(asdict(settings), indent=2) + "\n", encoding="utf-8")
        artifacts = {
            _MODEL_FILE: str(model_path),
            _SPM_MODEL: str(spm_model),
            _SETTINGS: str(settings_path),
        }
        with mlflow.start_run(run_id=run.run_id):
            info = tracking.with_retry(
                mlflow.pyfunc.log_model,
                name=MODEL_NAME,
                python_model=str(Path(__file__).with_name("_mlflow_model.py")),  # from code
                artifacts=artifacts,
                code_paths=[package_dir],
                signature=_signature(),
                input_example=[EXAMPLE],  # shown in the UI with a ready-made serving request
                pip_requirements=_requirements(),
            )
    result: dict[str, Any] = {
        "model_uri": info.model_uri,
        "registered_name": registered_name,
        "version": None,
        "registered_uri": None,
    }
    if registered_name:
        version = tracking.with_retry(mlflow.register_model, info.model_uri, registered_name)
        result.update(
            version=int(version.version),
            registered_uri=f"models:/{registered_name}/{version.version}",
        )
        log.info("registered %s as %s", info.model_uri, result["registered_uri"])
    return result
