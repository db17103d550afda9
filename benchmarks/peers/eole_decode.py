"""Beam search with eole's own translator, timed in one process: the peer side of
``benchmarks/bench_peer_decoding.py``. Runs in the peer's virtual environment
(``benchmarks/.venv-peer-eole``), never in the project's.

``--weights W.pt``: a state dict already in eole's parameter names (written by
bench_peer_decoding.py from our model file) is saved as the model directory's
``model.00.safetensors`` beside the ``config.json`` and ``vocab.json`` the caller wrote there.

Then eole's inference engine (``InferenceEnginePY``, what ``eole predict`` runs) translates the
source lines once to warm up and ``--runs`` more times; each run's wall and process CPU seconds
are timed around ``infer_list`` (model loading excluded, as on our side). The last run's best
hypotheses (pieces joined by spaces) go to ``--output``; the timings are printed as one JSON
line prefixed ``RESULT``. ``--runs 0``: translate once, untimed (bench_time_to_bleu's scoring).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--weights", type=Path, help="state dict in eole's names (torch file)")
    parser.add_argument("--source", type=Path, required=True, help="pieces, one line each")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.weights:
        from safetensors.torch import save_file

        state = torch.load(args.weights, map_location="cpu", weights_only=True)
        save_file(
            {k: v.contiguous().clone() for k, v in state.items()},
            args.model_dir / "model.00.safetensors",
        )

    from eole.config.run import PredictConfig
    from eole.inference_engine import InferenceEnginePY

    config = PredictConfig(
        model_path=str(args.model_dir),
        src=str(args.source),
        output=str(args.output),
        beam_size=args.beam,
        length_penalty="wu",  # GNMT's ((5 + |Y|) / 6)^alpha, as ours
        alpha=args.alpha,
        max_length=args.max_length,
        batch_type="tokens",
        batch_size=args.batch_tokens,
        n_best=1,
        gpu_ranks=[],
        world_size=1,
        seed=1,
    )
    engine = InferenceEnginePY(config)
    lines = args.source.read_text(encoding="utf-8").splitlines()
    _, _, preds = engine.infer_list(lines)  # warm-up (the output with --runs 0)
    wall, cpu = [], []
    for _ in range(args.runs):
        start, cpu_start = time.perf_counter(), time.process_time()
        _, _, preds = engine.infer_list(lines)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    engine.terminate()
    best = [p[0] if isinstance(p, list) else p for p in preds]
    args.output.write_text("\n".join(best) + "\n", encoding="utf-8")
    print(
        "RESULT " + json.dumps({"wall_seconds": wall, "cpu_seconds": cpu, "sentences": len(lines)})
    )


if __name__ == "__main__":
    main()
