# Evaluation: translate (beam search, §6.1) → score (sacreBLEU) → report.


rule translate:
    input:
        model="results/runs/{experiment}/averaged.pt",
        spm=lambda wc: P.spm_model(wc.experiment),
        src=lambda wc: P.test_file(wc.experiment, wc.test_set, "src"),
    output:
        hyp="results/runs/{experiment}/{test_set}.hyp",
    params:
        beam=lambda wc: P.exp(wc.experiment)["translate"]["beam"],
        alpha=lambda wc: P.exp(wc.experiment)["translate"]["alpha"],
        max_len_b=lambda wc: P.exp(wc.experiment)["translate"]["max_len_b"],
        max_tokens=lambda wc: P.exp(wc.experiment)["translate"]["max_tokens"],
        tracking=lambda wc: P.tracking_flags(wc.experiment),
    log:
        "logs/translate/{experiment}/{test_set}.log",
    benchmark:
        "results/benchmarks/translate/{experiment}/{test_set}.tsv"
    threads: 2
    shell:
        "python -m transformer_nmt translate --model {input.model:q} --spm-model {input.spm:q}"
        " --input {input.src:q} --output {output.hyp:q} --beam {params.beam}"
        " --alpha {params.alpha} --max-len-b {params.max_len_b} --max-tokens {params.max_tokens}"
        " {params.tracking} > {log:q} 2>&1"


rule score:
    input:
        hyp="results/runs/{experiment}/{test_set}.hyp",
        ref=lambda wc: P.test_file(wc.experiment, wc.test_set, "tgt"),
    output:
        scores="results/runs/{experiment}/{test_set}.scores.json",
    params:
        tgt=lambda wc: P.langs(wc.experiment)[1],
        tracking=lambda wc: P.tracking_flags(wc.experiment),
    log:
        "logs/score/{experiment}/{test_set}.log",
    benchmark:
        "results/benchmarks/score/{experiment}/{test_set}.tsv"
    shell:
        "python -m transformer_nmt score --hyp {input.hyp:q} --ref {input.ref:q}"
        " --tgt-lang {params.tgt} --out {output.scores:q} {params.tracking} > {log:q} 2>&1"


rule report:
    input:
        P.all_scores(),
    output:
        report="results/report.md",
    params:
        experiments=P.json(P.report_experiments()),
    log:
        "logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    shell:
        "python -m transformer_nmt report --scores {input:q} --out {output.report:q}"
        " --experiments {params.experiments:q} --mlflow > {log:q} 2>&1"
