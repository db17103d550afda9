# Model stages: train (Lightning; resumes from results/runs/{experiment}/checkpoints/, which is
# deliberately NOT an output: Snakemake deletes the outputs of a failed job) → average.


rule train:
    input:
        bin=lambda wc: P.train_bin_files(wc.experiment),
        spm=lambda wc: P.spm_model(wc.experiment),
        clean_report=lambda wc: P.clean_report(wc.experiment),
    output:
        summary="results/runs/{experiment}/train_summary.json",
    params:
        model=lambda wc: P.json(P.model_spec(wc.experiment)),
        train=lambda wc: P.json(P.exp(wc.experiment)["train"]),
        bin_dir=lambda wc: P.bin_dir(wc.experiment),
        src=lambda wc: P.langs(wc.experiment)[0],
        tgt=lambda wc: P.langs(wc.experiment)[1],
        run_dir="results/runs/{experiment}",
        tracking=lambda wc: P.tracking_flags(wc.experiment),
    log:
        "logs/train/{experiment}.log",
    benchmark:
        "results/benchmarks/train/{experiment}.tsv"
    threads: lambda wc: P.train_resource(wc.experiment, "threads", 2)
    resources:
        gpu=lambda wc: P.train_resource(wc.experiment, "gpu", 0),
        mem_mb=lambda wc: P.train_resource(wc.experiment, "mem_mb", 4000),
        runtime=lambda wc: P.train_resource(wc.experiment, "runtime", 60),
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
        summary="results/runs/{experiment}/train_summary.json",
    output:
        model="results/runs/{experiment}/averaged.pt",
    params:
        last_k=lambda wc: P.exp(wc.experiment)["average_last_k"],
        checkpoint_dir="results/runs/{experiment}/checkpoints",
        tracking=lambda wc: P.tracking_flags(wc.experiment),
    log:
        "logs/average/{experiment}.log",
    benchmark:
        "results/benchmarks/average/{experiment}.tsv"
    shell:
        "python -m transformer_nmt average --checkpoint-dir {params.checkpoint_dir:q}"
        " --last {params.last_k} --out {output.model:q} {params.tracking} > {log:q} 2>&1"
