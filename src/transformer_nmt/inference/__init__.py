"""Inference: translating with a trained model, and serving it.

- ``engine``: the interface every engine offers (``TranslationEngine``: ``encode`` / ``search`` /
  ``decode``, and the shared ``translate`` / ``translate_nbest`` over lines) and its batching;
- ``translator``: the PyTorch engine (``Translator``, also ``transformer_nmt.Translator``);
- ``ct2``: the optional CTranslate2 engine and its exporter (``Ct2Translator``, ``export_ct2``);
- ``factory``: ``open_translator(engine, ...)``, the engine a user names;
- ``output``: the text and attention formats of ``translate``;
- ``serving`` (+ ``_mlflow_model``): the trained model as an MLflow pyfunc model.

The engines depend on ``engine``, the factory on the engines: no circle. Nothing here imports
Lightning or the training code (tests/test_repo.py checks it).
"""
