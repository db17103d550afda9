"""The files of a run directory, ``results/runs/<experiment>/``, named once, with who writes each.

A run directory is one pipeline experiment instance. Its file names are here so that writer and
readers agree (the readers include the report, the translator and MLflow tracking, which must
not import the training code that writes most of them). ``experiments/paths.py`` builds its
Snakemake output templates from these names.

=======================  ==========================================  ===========================
file                     what it holds                               written by
=======================  ==========================================  ===========================
``train_config.json``    the experiment's settings (model, train,    Snakefile rule
                         data paths)                                 ``train_config``
``checkpoints/``         ``step=<8 digits>.ckpt`` every T minutes    ``training.callbacks``
                         or N steps; ``finished.json`` once the       (``StepCheckpoint``),
                         last step is done; ``last_validation.json``  ``training.resume``
``superseded/<time>/``   checkpoints of a run whose learning         ``training.resume``
                         settings changed (moved aside, never
                         deleted)
``metrics.csv``          losses, learning rate, throughput, dev      ``training.callbacks``
                         scores per logged step                      (``MetricsHistory``)
``train_summary.json``   the run's result: steps, dev perplexity,    ``training.run``
                         resume decision, vocabulary identity
``.train.lock``          one training job per directory at a time    ``training.run``
``logs/``                each training attempt's log                 ``cli.train``
``averaged.pt``          the averaged model file (§6.1)              ``cli.average``
                                                                     (``runs.checkpoints``)
``average_selection.json``  dev BLEU per number K of checkpoints      ``cli.average``
                         averaged, and the K chosen                  (``evaluation.selection``)
``alpha_selection.json``  dev BLEU per length penalty α of the        ``cli.select_alpha``
                         averaged model, and the α chosen             (``evaluation.selection``)
``<test set>.hyp``       translations, one per source line           ``cli.translate``
``<test set>.scores.json``  sacreBLEU, chrF, paper-comparable BLEU    ``cli.score``
``figures/``             attention maps (PNG + CSV) and the run's     ``cli.attention_maps``,
                         report figures                              ``cli.report``
``experiment.json``      the experiment's record for the report      ``cli.report``
``mlflow_run.json``      which MLflow run is this directory's        ``tracking.identity``
``mlflow_model.json``    the registered MLflow model's URIs          ``cli.register``
=======================  ==========================================  ===========================
"""

from __future__ import annotations

TRAIN_CONFIG_FILE = "train_config.json"
CHECKPOINT_DIR = "checkpoints"
FINISHED_FILE = "finished.json"  # in CHECKPOINT_DIR
LAST_VALIDATION_FILE = "last_validation.json"  # in CHECKPOINT_DIR
SUPERSEDED_DIR = "superseded"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "train_summary.json"
TRAIN_LOCK_FILE = ".train.lock"
ATTEMPT_LOG_DIR = "logs"
AVERAGED_MODEL = "averaged.pt"
SELECTION_FILE = "average_selection.json"
ALPHA_SELECTION_FILE = "alpha_selection.json"
FIGURES_DIR = "figures"
EXPERIMENT_FILE = "experiment.json"
RUN_RECORD = "mlflow_run.json"
MLFLOW_MODEL_FILE = "mlflow_model.json"
