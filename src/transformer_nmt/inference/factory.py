"""The engine factory: ``open_translator(engine, ...)`` opens a model with the engine a user
names (``translate --engine``). It depends on the engines; they do not depend on it."""

from __future__ import annotations

from pathlib import Path

from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.inference.engine import TranslationEngine
from transformer_nmt.search import SearchSettings

ENGINES = ("torch", "ctranslate2")


def open_translator(
    engine: str,
    model_path: str | Path,
    spm_model_path: str | Path,
    settings: SearchSettings,
    device: str = "auto",
    quantize: str | None = None,
) -> TranslationEngine:
    """A ``Translator`` (engine ``torch``, a model file) or a ``ct2.Ct2Translator`` (engine
    ``ctranslate2``, a directory written by ``export-ct2``): the same ``translate`` interface.
    ``quantize`` (torch engine only): ``quantize_model``."""
    if engine == "ctranslate2" and quantize is not None:
        raise ConfigError(
            "--quantize is for --engine torch; CTranslate2 models are quantised when exported "
            "(export-ct2 --quantization)"
        )
    if engine == "ctranslate2":
        from transformer_nmt.inference.ct2 import Ct2Translator

        return Ct2Translator(model_path, spm_model_path, settings, device)
    if engine != "torch":
        raise ConfigError(f"--engine must be one of {list(ENGINES)}, got {engine!r}")
    if Path(model_path).is_dir():
        raise CheckpointError(
            f"{model_path}: a directory, not a model file (--engine ctranslate2?)"
        )
    from transformer_nmt.inference.translator import Translator

    return Translator(model_path, spm_model_path, settings, device, quantize)
