# Model stages: train (Lightning; resumes from results/runs/{experiment}/checkpoints/, which is
# deliberately NOT an output: Snakemake deletes the outputs of a failed job) → average.


rule train:
    input:
        bin=lambda wc: pipeline.train_bin_files(wc.experiment),
        spm=lambda wc: pipeline.spm_model(wc.experiment),
        clean_report=lambda wc: pipeline.clean_report(wc.experiment),
    output:
        summary=paths.TRAIN_SUMMARY,
    params:
        model=lambda wc: paths.canonical_json(pipeline.model_spec(wc.experiment)),
        train=lambda wc: paths.canonical_json(pipeline.experiment(wc.experiment)["train"]),
        bin_dir=lambda wc: pipeline.bin_dir(wc.experiment),
        src=lambda wc: pipeline.langs(wc.experiment)[0],
        tgt=lambda wc: pipeline.langs(wc.experiment)[1],
        run_dir=paths.RUN_DIR,
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    log:
        "logs/train/{experiment}.log",
    benchmark:
        "results/benchmarks/train/{experiment}.tsv"
    threads: lambda wc: pipeline.train_resource(wc.experiment, "threads", 2)
    resources:
        gpu=lambda wc: pipeline.train_resource(wc.experiment, "gpu", 0),
        mem_mb=lambda wc: pipeline.train_resource(wc.experiment, "mem_mb", 4000),
        runtime=lambda wc: pipeline.train_resource(wc.experiment, "runtime", 60),
        # launcher for multi-task jobs: profiles/slurm sets "srun" so that SLURM starts one
        # Lightning DDP process per GPU (Lightning reads the ranks from SLURM's environment).
        mpi="",
    shell:
        "{resources.mpi} python -m transformer_nmt train --bin-dir {params.bin_dir:q}"
        " --spm-model {input.spm:q} --src {params.src} --tgt {params.tgt}"
        " --run-dir {params.run_dir:q} --model {params.model:q} --train {params.train:q}"
        " --clean-report {input.clean_report:q} {params.tracking} >> {log:q} 2>&1"


rule average:
    input:
        unpack(lambda wc: pipeline.average_inputs(wc.experiment)),
        summary=rules.train.output.summary,
    output:
        model=paths.AVERAGED_MODEL,
    params:
        # --last K, or --last auto with the dev files and the experiment's search settings
        last_k=lambda wc: pipeline.average_flags(wc.experiment),
        checkpoint_dir=paths.CHECKPOINT_DIR,
        tracking=lambda wc: pipeline.tracking_flags(wc.experiment),
    log:
        "logs/average/{experiment}.log",
    benchmark:
        "results/benchmarks/average/{experiment}.tsv"
    shell:
        "python -m transformer_nmt average --checkpoint-dir {params.checkpoint_dir:q}"
        " {params.last_k} --out {output.model:q} {params.tracking} > {log:q} 2>&1"
