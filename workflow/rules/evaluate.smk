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
        beam=lambda wc: pipeline.experiment(wc.experiment)["translate"]["beam"],
        alpha=lambda wc: pipeline.experiment(wc.experiment)["translate"]["alpha"],
        max_len_b=lambda wc: pipeline.experiment(wc.experiment)["translate"]["max_len_b"],
        max_tokens=lambda wc: pipeline.experiment(wc.experiment)["translate"]["max_tokens"],
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt translate --model {input.model:q} --spm-model {input.spm:q}"
        " --input {input.src:q} --output {output.hyp:q} --beam {params.beam}"
        " --alpha {params.alpha} --max-len-b {params.max_len_b} --max-tokens {params.max_tokens}"
        " {params.tracking} > {log:q} 2>&1"


rule score:
    input:
        hyp=rules.translate.output.hyp,
        ref=lambda wc: pipeline.test_file(wc.experiment, wc.test_set, "tgt"),
    output:
        scores=paths.SCORES,
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
        report=paths.REPORT,
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
        " --out {output.report:q}"
        " --experiments {params.experiments:q} --mlflow > {log:q} 2>&1"
