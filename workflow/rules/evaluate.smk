# Evaluation: translate (beam search, §6.1) → score (sacreBLEU) → report.


rule translate:
    input:
        model=rules.average.output.model,
        spm=lambda wc: pipeline.spm_model(wc.experiment),
        src=lambda wc: pipeline.test_file(wc.experiment, wc.test_set, "src"),
    output:
        hyp=paths.HYPOTHESES,
    log:
        "logs/translate/{experiment}/{test_set}.log",
    benchmark:
        "results/benchmarks/translate/{experiment}/{test_set}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        search=lambda wc: pipeline.search_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt translate --model {input.model:q} --spm-model {input.spm:q}"
        " --input {input.src:q} --output {output.hyp:q} {params.search}"
        " {params.tracking} > {log:q} 2>&1"


rule register:
    # the averaged model as an MLflow model (pyfunc), registered under the experiment's name:
    # mlflow models serve -m models:/<experiment>/<version> --env-manager local
    input:
        model=rules.average.output.model,
        spm=lambda wc: pipeline.spm_model(wc.experiment),
    output:
        record=paths.MLFLOW_MODEL,
    log:
        "logs/register/{experiment}.log",
    benchmark:
        "results/benchmarks/register/{experiment}.tsv"
    conda:
        "../../environment.yml"
    params:
        run_dir=lambda wc, input: str(Path(input.model).parent),
        search=lambda wc: pipeline.search_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt register --run-dir {params.run_dir:q}"
        " --spm-model {input.spm:q} --out {output.record:q} {params.search}"
        " {params.tracking} > {log:q} 2>&1"


rule score:
    input:
        hyp=rules.translate.output.hyp,
        ref=lambda wc: pipeline.test_file(wc.experiment, wc.test_set, "tgt"),
    output:
        scores=report(
            paths.SCORES,
            caption="../report/scores.rst",
            category="Results",
            subcategory="{experiment}",
            labels={"experiment": "{experiment}", "test set": "{test_set}"},
        ),
    log:
        "logs/score/{experiment}/{test_set}.log",
    benchmark:
        "results/benchmarks/score/{experiment}/{test_set}.tsv"
    conda:
        "../../environment.yml"
    params:
        tgt=lambda wc: pipeline.langs(wc.experiment)[1],
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt score --hyp {input.hyp:q} --ref {input.ref:q}"
        " --tgt-lang {params.tgt} --out {output.scores:q} {params.tracking} > {log:q} 2>&1"


rule report:
    input:
        pipeline.all_scores(),
    output:
        report=report(
            paths.REPORT,
            caption="../report/results.rst",
            category="Results",
            labels={"table": "all experiments"},
        ),
        # learning curves, dev BLEU against averaged checkpoints (evaluation/figures.py): a
        # directory, since which figures exist depends on the runs (each PNG has its CSV)
        figures=report(
            directory(paths.FIGURES_DIR),
            patterns=["{kind}/{group}/{figure}.png"],
            caption="../report/figures.rst",
            category="Figures",
            subcategory="{group}",
            labels={"figure": "{figure}", "of": "{group}"},
        ),
    log:
        "logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    conda:
        "../../environment.yml"
    params:
        experiments=paths.canonical_json(pipeline.report_experiments()),
    shell:
        "python -m transformer_nmt report --scores {input:q} --runs-dir results/runs"
        " --out {output.report:q} --figures-dir {output.figures:q}"
        " --experiments {params.experiments:q} --mlflow > {log:q} 2>&1"
