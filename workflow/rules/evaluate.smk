# Evaluation: translate (beam search, §6.1) → score (sacreBLEU) → report.


# translate.alpha: auto: the averaged model's length penalty, chosen on the dev set (§6.1: the
# paper chose its α = 0.6 so); every stage that decodes with the experiment's search reads it.
rule select_alpha:
    input:
        model=rules.average.output.model,
        spm=lambda wc: pipeline.spm_model(wc.experiment),
        dev_src=lambda wc: pipeline.test_file(wc.experiment, "valid", "src"),
        dev_ref=lambda wc: pipeline.test_file(wc.experiment, "valid", "tgt"),
    output:
        selection=paths.ALPHA_SELECTION,
    log:
        "logs/select_alpha/{experiment}.log",
    benchmark:
        "results/benchmarks/select_alpha/{experiment}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        flags=lambda wc: pipeline.select_alpha_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt select-alpha --model {input.model:q} --spm-model {input.spm:q}"
        " --out {output.selection:q} {params.flags} {params.tracking} > {log:q} 2>&1"


rule translate:
    input:
        unpack(lambda wc: pipeline.alpha_inputs(wc.experiment)),
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
        search=lambda wc: pipeline.translate_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt translate --model {input.model:q} --spm-model {input.spm:q}"
        " --input {input.src:q} --output {output.hyp:q} {params.search}"
        " {params.tracking} > {log:q} 2>&1"


rule register:
    # the averaged model as an MLflow model (pyfunc), registered under the experiment's name:
    # mlflow models serve -m models:/<experiment>/<version> --env-manager local
    input:
        unpack(lambda wc: pipeline.alpha_inputs(wc.experiment)),
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
        # the target language, and --lowercase for a lowercasing vocabulary (pipeline.py)
        tgt=lambda wc: pipeline.score_language_and_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt score --hyp {input.hyp:q} --ref {input.ref:q}"
        " --tgt-lang {params.tgt} --out {output.scores:q} {params.tracking} > {log:q} 2>&1"


rule attention_maps:
    # the last decoder layer's encoder-decoder attention (every head and their mean) of the
    # first lines of the experiment's first test set: PNG + CSV each, also MLflow artifacts
    input:
        unpack(lambda wc: pipeline.alpha_inputs(wc.experiment)),
        model=rules.average.output.model,
        spm=lambda wc: pipeline.spm_model(wc.experiment),
        src=lambda wc: pipeline.attention_map_source(wc.experiment),
    output:
        figures=[
            report(
                paths.ATTENTION_MAP.replace("{line}", str(line)),
                caption="../report/attention_map.rst",
                category="Attention maps",
                subcategory="{experiment}",
                labels={"experiment": "{experiment}", "test line": str(line), "file": "PNG"},
            )
            for line in pipeline.attention_map_lines()
        ],
        tables=[
            report(
                paths.ATTENTION_MAP_CSV.replace("{line}", str(line)),
                caption="../report/attention_map.rst",
                category="Attention maps",
                subcategory="{experiment}",
                labels={"experiment": "{experiment}", "test line": str(line), "file": "CSV"},
            )
            for line in pipeline.attention_map_lines()
        ],
    log:
        "logs/attention_maps/{experiment}.log",
    benchmark:
        "results/benchmarks/attention_maps/{experiment}.tsv"
    conda:
        "../../environment.yml"
    params:
        lines=" ".join(str(line) for line in pipeline.attention_map_lines()),
        out_dir=lambda wc: paths.RUN_FIGURES_DIR.format(experiment=wc.experiment),
        search=lambda wc: pipeline.search_flags(wc.experiment),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt attention-maps --model {input.model:q}"
        " --spm-model {input.spm:q} --input {input.src:q} --lines {params.lines}"
        " --out-dir {params.out_dir:q} {params.search} {params.tracking} > {log:q} 2>&1"


rule report:
    input:
        scores=pipeline.all_scores(),
        figures=pipeline.all_attention_maps(),
        # Table 3's dev perplexity and BLEU (config key table3)
        summaries=pipeline.report_summaries(),
    output:
        report=report(
            paths.REPORT,
            caption="../report/results.rst",
            category="Results",
            labels={"table": "all experiments"},
        ),
        # the same table as CSV: workflow/report/workflow.rst puts it on the landing page
        table=report(
            paths.REPORT_TABLE,
            caption="../report/results.rst",
            category="Results",
            labels={"table": "all experiments (CSV)"},
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
        # Table 3 rows, seed groups, the paired bootstrap's baseline (config keys table3,
        # seeds, significance)
        studies=paths.canonical_json(pipeline.report_studies()),
    shell:
        "python -m transformer_nmt report --scores {input.scores:q} --runs-dir results/runs"
        " --out {output.report:q} --table-csv {output.table:q} --figures-dir {output.figures:q}"
        " --experiments {params.experiments:q} --studies {params.studies:q}"
        " --mlflow > {log:q} 2>&1"
