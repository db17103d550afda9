# Data stages: download → prepare → spm_train → encode (docs/interfaces.md, "CLI of the stages").
# Shared by every experiment on a dataset pair; not tracked in MLflow (they belong to no single
# experiment): the train stage logs the cleaning report, the vocabulary and their checksums.
# download and prepare are generated per dataset / pair: their outputs are the registry's files.
# The registry's location comes from the environment (set by the Snakefile), its content through
# params: moving the checkout re-runs nothing, changing a dataset's entry re-runs its stages.

for _dataset in P.datasets():

    rule:
        name:
            f"download_{_dataset}"
        output:
            P.raw_files(_dataset),
        params:
            # the dataset's files in the registry: a changed URL or checksum re-runs the download
            entry=P.registry_entry_json(_dataset),
            out_dir=f"resources/{_dataset}",
            dataset=_dataset,
        log:
            f"logs/download/{_dataset}.log",
        benchmark:
            f"results/benchmarks/download/{_dataset}.tsv"
        retries: 2
        shell:
            'python -m transformer_nmt download --registry "$TRANSFORMER_NMT_REGISTRY"'
            " --dataset {params.dataset} --out-dir {params.out_dir:q}"
            " > {log:q} 2>&1"


for _dataset, _pair in P.data_pairs():

    rule:
        name:
            f"prepare_{_dataset}_{_pair.replace('-', '_')}"
        input:
            P.raw_files(_dataset),
        output:
            P.text_files(_dataset, _pair),
            report=f"results/data/{_dataset}/{_pair}/clean_report.json",
        params:
            clean=P.json(P.data_settings(_dataset, _pair)["clean"]),
            entry=P.registry_pair_json(_dataset, _pair),
            raw_dir=f"resources/{_dataset}",
            out_dir=f"results/data/{_dataset}/{_pair}",
            dataset=_dataset,
            pair=_pair,
        log:
            f"logs/prepare/{_dataset}_{_pair}.log",
        benchmark:
            f"results/benchmarks/prepare/{_dataset}_{_pair}.tsv"
        shell:
            'python -m transformer_nmt prepare --registry "$TRANSFORMER_NMT_REGISTRY"'
            " --dataset {params.dataset} --pair {params.pair} --raw-dir {params.raw_dir:q}"
            " --out-dir {params.out_dir:q} --clean {params.clean:q} > {log:q} 2>&1"


rule spm_train:
    input:
        src=lambda wc: P.text_file(wc.dataset, wc.pair, "train", "src"),
        tgt=lambda wc: P.text_file(wc.dataset, wc.pair, "train", "tgt"),
    output:
        model="results/spm/{dataset}/{pair}/spm.model",
        vocab="results/spm/{dataset}/{pair}/spm.vocab",
    params:
        vocab_size=lambda wc: P.data_settings(wc.dataset, wc.pair)["vocab_size"],
        sample=lambda wc: P.data_settings(wc.dataset, wc.pair)["spm_sample_sentences"],
        seed=lambda wc: P.data_settings(wc.dataset, wc.pair)["spm_seed"],
        prefix="results/spm/{dataset}/{pair}/spm",
    log:
        "logs/spm_train/{dataset}_{pair}.log",
    benchmark:
        "results/benchmarks/spm_train/{dataset}_{pair}.tsv"
    threads: 4
    shell:
        "python -m transformer_nmt spm-train --inputs {input.src:q} {input.tgt:q}"
        " --vocab-size {params.vocab_size} --sample-sentences {params.sample}"
        " --seed {params.seed} --model-prefix {params.prefix:q} > {log:q} 2>&1"


rule encode:
    input:
        text="results/data/{dataset}/{pair}/{split}.{lang}",
        spm="results/spm/{dataset}/{pair}/spm.model",
    output:
        tokens="results/bin/{dataset}/{pair}/{split}.{lang}.tokens.npy",
        offsets="results/bin/{dataset}/{pair}/{split}.{lang}.offsets.npy",
    params:
        out_dir="results/bin/{dataset}/{pair}",
    log:
        "logs/encode/{dataset}_{pair}_{split}.{lang}.log",
    benchmark:
        "results/benchmarks/encode/{dataset}_{pair}_{split}.{lang}.tsv"
    threads: 4
    shell:
        "python -m transformer_nmt encode --spm-model {input.spm:q} --inputs {input.text:q}"
        " --out-dir {params.out_dir:q} --workers {threads} > {log:q} 2>&1"
