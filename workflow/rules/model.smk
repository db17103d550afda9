# Model stages: train_config → train (Lightning; resumes from
# results/runs/{experiment}/checkpoints/, which is deliberately NOT an output: Snakemake deletes
# the outputs of a failed job) → average.


# The experiment's model and train settings as a file, so that the train command line stays
# short (`tail -f logs/train/<experiment>.log` shows the run). A local `run:` rule, the one
# exception to "rules are shell calls into the package": it only writes its params to a file.
rule train_config:
    output:
        config=paths.TRAIN_CONFIG,
    log:
        "logs/train_config/{experiment}.log",
    benchmark:
        "results/benchmarks/train_config/{experiment}.tsv"
    params:
        settings=lambda wc: paths.canonical_json(pipeline.train_config(wc.experiment)),
    run:
        paths.write_train_config(output.config, params.settings, log[0])


rule train:
    input:
        # a changed setting re-runs train_config (params) and so training; so does anything
        # that rewrites the file (`--forcerun train_config`, deleting it): avoid those.
        config=rules.train_config.output.config,
        bin=lambda wc: pipeline.train_bin_files(wc.experiment),
        spm=lambda wc: pipeline.spm_model(wc.experiment),
        clean_report=lambda wc: pipeline.clean_report(wc.experiment),
    output:
        summary=paths.TRAIN_SUMMARY,
    log:
        "logs/train/{experiment}.log",
    benchmark:
        "results/benchmarks/train/{experiment}.tsv"
    conda:
        "../../environment.yml"
    threads: lambda wc: pipeline.train_resource(wc.experiment, "threads", 2)
    resources:
        gpu=lambda wc: pipeline.train_resource(wc.experiment, "gpu", 0),
        mem_mb=lambda wc: pipeline.train_resource(wc.experiment, "mem_mb", 4000),
        runtime=lambda wc: pipeline.train_resource(wc.experiment, "runtime", 60),
        # launcher for multi-task jobs: profiles/slurm sets "srun" so that SLURM starts one
        # Lightning DDP process per GPU (Lightning reads the ranks from SLURM's environment).
        mpi="",
    params:
        bin_dir=lambda wc: pipeline.bin_dir(wc.experiment),
        src=lambda wc: pipeline.langs(wc.experiment)[0],
        tgt=lambda wc: pipeline.langs(wc.experiment)[1],
        run_dir=lambda wc, output: os.path.dirname(output.summary),
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    # The command is the pipeline's (Pipeline.TRAIN_COMMAND, also the benchmarks'); its output
    # goes to the log, descriptor 3 stays Snakemake's stderr, where the job writes one-line
    # warnings (tracking.notice: a failing MLflow store), once per job.
    shell:
        "TRANSFORMER_NMT_NOTICE_FD=3 {resources.mpi} "
        + pipeline.TRAIN_COMMAND
        + " 3>&2 >> {log:q} 2>&1"


rule average:
    input:
        unpack(lambda wc: pipeline.average_inputs(wc.experiment)),
        summary=rules.train.output.summary,
    output:
        model=paths.AVERAGED_MODEL,
    log:
        "logs/average/{experiment}.log",
    benchmark:
        "results/benchmarks/average/{experiment}.tsv"
    conda:
        "../../environment.yml"
    params:
        # --last K, or --last auto with the dev files and the experiment's search settings
        last_k=lambda wc: pipeline.average_flags(wc.experiment),
        checkpoint_dir=paths.CHECKPOINT_DIR,
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    shell:
        "python -m transformer_nmt average --checkpoint-dir {params.checkpoint_dir:q}"
        " {params.last_k} --out {output.model:q} {params.tracking} > {log:q} 2>&1"
