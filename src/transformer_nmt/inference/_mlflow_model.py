"""MLflow "model from code" of ``serving.log_translator_model``: MLflow runs this file to build
the pyfunc model when it loads a logged translator (no pickled Python object)."""

from mlflow.models import set_model

from transformer_nmt.inference.serving import TranslatorModel

set_model(TranslatorModel())
