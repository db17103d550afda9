# Data stages: download → prepare → spm_train → encode (docs/interfaces.md, "CLI of the stages").
# Shared by every experiment on a dataset pair; not tracked in MLflow (they belong to no single
# experiment): the train stage logs the cleaning report, the vocabulary and their checksums.
# download and prepare are generated per dataset / pair: their outputs are the registry's files.
# The registry's location comes from the environment (set by the Snakefile), its content through
# params: moving the checkout re-runs nothing, changing a dataset's entry re-runs its stages.

for _dataset in pipeline.datasets(downloaded=True):

    rule:
        name:
            f"download_{_dataset}"
        output:
            pipeline.raw_files(_dataset),
            # an output, so that --forcerun download_<dataset> pins the checksums afresh
            lock=paths.CHECKSUM_LOCK.format(dataset=_dataset),
        log:
            f"logs/download/{_dataset}.log",
        benchmark:
            f"results/benchmarks/download/{_dataset}.tsv"
        retries: 2
        conda:
            "../../environment.yml"
        params:
            # the dataset's files in the registry: a changed URL or checksum re-runs the download
            entry=pipeline.registry_entry_json(_dataset),
            out_dir=lambda wc, output: os.path.dirname(output[0]),
            dataset=_dataset,
        shell:
            'python -m transformer_nmt download --registry "$TRANSFORMER_NMT_REGISTRY"'
            " --dataset {params.dataset} --out-dir {params.out_dir:q}"
            " > {log:q} 2>&1"


# A user's own corpus (config `datasets:`, data/local.py): its files are linked, not fetched,
# and read once to check them (alignment, TSV columns, empty lines, carving, test overlap)
# before any other job; an edited file (an input) links and checks afresh.
for _dataset in pipeline.datasets(downloaded=False):

    rule:
        name:
            f"download_{_dataset}"
        input:
            pipeline.local_files(_dataset),
        output:
            pipeline.raw_files(_dataset),
            lock=paths.CHECKSUM_LOCK.format(dataset=_dataset),
        log:
            f"logs/download/{_dataset}.log",
        benchmark:
            f"results/benchmarks/download/{_dataset}.tsv"
        conda:
            "../../environment.yml"
        params:
            entry=pipeline.registry_entry_json(_dataset),
            out_dir=lambda wc, output: os.path.dirname(output[0]),
            dataset=_dataset,
            # the checks allow the pair's clean.max_invalid_share of empty or undecodable lines
            clean=pipeline.download_clean_json(_dataset),
        shell:
            'python -m transformer_nmt download --registry "$TRANSFORMER_NMT_REGISTRY"'
            " --dataset {params.dataset} --out-dir {params.out_dir:q} --clean {params.clean:q}"
            " > {log:q} 2>&1"


for _dataset, _pair in pipeline.data_pairs():

    rule:
        name:
            f"prepare_{_dataset}_{_pair.replace('-', '_')}"
        input:
            pipeline.raw_files(_dataset),
            lock=paths.CHECKSUM_LOCK.format(dataset=_dataset),
        output:
            pipeline.text_files(_dataset, _pair),
            report=paths.CLEAN_REPORT.format(dataset=_dataset, pair=_pair),
        log:
            f"logs/prepare/{_dataset}_{_pair}.log",
        benchmark:
            f"results/benchmarks/prepare/{_dataset}_{_pair}.tsv"
        conda:
            "../../environment.yml"
        threads: 4  # cleaning workers (data/parallel.py); snakemake caps it at --cores
        params:
            clean=paths.canonical_json(pipeline.data_settings(_dataset, _pair)["clean"]),
            entry=pipeline.registry_pair_json(_dataset, _pair),
            raw_dir=lambda wc, input: os.path.dirname(input[0]),
            out_dir=lambda wc, output: os.path.dirname(output.report),
            dataset=_dataset,
            pair=_pair,
        shell:
            'python -m transformer_nmt prepare --registry "$TRANSFORMER_NMT_REGISTRY"'
            " --dataset {params.dataset} --pair {params.pair} --raw-dir {params.raw_dir:q}"
            " --out-dir {params.out_dir:q} --clean {params.clean:q} --workers {threads}"
            " > {log:q} 2>&1"


rule spm_train:
    input:
        src=lambda wc: pipeline.text_file(wc.dataset, wc.pair, "train", "src"),
        tgt=lambda wc: pipeline.text_file(wc.dataset, wc.pair, "train", "tgt"),
    output:
        model=paths.SPM_MODEL,
        vocab=paths.SPM_VOCAB,
    log:
        "logs/spm_train/{dataset}_{pair}.log",
    benchmark:
        "results/benchmarks/spm_train/{dataset}_{pair}.tsv"
    conda:
        "../../environment.yml"
    threads: 4
    params:
        vocab_size=lambda wc: pipeline.data_settings(wc.dataset, wc.pair)["vocab_size"],
        sample=lambda wc: pipeline.data_settings(wc.dataset, wc.pair)["spm_sample_sentences"],
        # the seed, and the flag of the data setting lowercase when it is on (pipeline.py)
        seed=lambda wc: pipeline.spm_seed_and_flags(wc.dataset, wc.pair),
        prefix=paths.SPM_PREFIX,
    shell:
        "python -m transformer_nmt spm-train --inputs {input.src:q} {input.tgt:q}"
        " --vocab-size {params.vocab_size} --sample-sentences {params.sample}"
        " --seed {params.seed} --model-prefix {params.prefix:q} > {log:q} 2>&1"


rule encode:
    input:
        text=paths.TEXT_FILE,
        spm=rules.spm_train.output.model,
    output:
        tokens=paths.TOKENS,
        offsets=paths.OFFSETS,
    log:
        "logs/encode/{dataset}_{pair}_{split}.{lang}.log",
    benchmark:
        "results/benchmarks/encode/{dataset}_{pair}_{split}.{lang}.tsv"
    conda:
        "../../environment.yml"
    threads: 4
    params:
        out_dir=paths.BIN_DIR,
    shell:
        "python -m transformer_nmt encode --spm-model {input.spm:q} --inputs {input.text:q}"
        " --out-dir {params.out_dir:q} --workers {threads} > {log:q} 2>&1"
