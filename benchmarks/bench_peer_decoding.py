"""Beam-4 decoding speed against a peer toolkit's own beam search (eole, the successor of
OpenNMT-py) on the *same weights*, the same sentences and the same search settings.

Our model file (``--model``, e.g. the demo's ``results/runs/multi30k_en_de_tiny/averaged.pt``)
is converted into an eole model directory: ``config.json`` (the same shape: d_model, N, h,
d_ff, LayerNorm epsilon, shared embeddings and pre-softmax projection, no attention biases
unless ours has them, sinusoidal positions interleaved as ours), ``vocab.json`` (our
SentencePiece pieces in id order, with our pad/unk/bos/eos) and the weights renamed
(``to_eole_state_dict``: our stacked [W^Q; W^K; W^V] split into eole's three matrices, our
sinusoid table written into eole's position buffers). eole's decoder layers are pre-LN only,
so only pre-LN models (``norm_first``, the demo's) convert; a post-LN model is refused.

Both sides decode the same source sentences: ours from text with its SentencePiece model
(``translation.Translator``, as ``translate`` does); eole from the same pieces with ``</s>``
appended, because our models are trained on ``x EOS`` and eole adds no EOS to a source. Search:
beam ``--beam``, GNMT length penalty with ``--alpha`` on both sides (eole's ``wu``), batches of
at most ``--max-tokens`` source tokens (eole: ``batch_type tokens``), outputs capped at the
source length + ``--max-len-b`` (eole has one absolute cap: the longest source + max_len_b).
Stopping differs: eole's beam search stops a sentence when its best hypothesis has finished,
ours when no live hypothesis can still beat the finished ones, so a few outputs may differ;
the share of identical outputs is printed, and with ``--reference`` the BLEU of both.

For each intra-op thread count (``--threads 1 2``), each toolkit translates the sentences once
to warm up and ``--runs`` times more in one process (model loading not timed; eole in its own
virtual environment through ``benchmarks/peers/eole_decode.py``); sentences/s from the median
wall time, and per CPU-second of the process. Prints a table with the ratios ours / eole and
writes ``benchmarks/out/peer_decoding_eole.json`` (load average, machine, date).

Usage (repository root, project environment, ``PYTHONPATH=src``):
``python benchmarks/bench_peer_decoding.py --model M --spm-model S --source F [--reference R]
[--runs 3] [--threads 1 2]``; create the peer's environment with
``benchmarks/peers/install_eole.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.cli.arguments import add_search_arguments, search_settings
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_lines, write_json
from transformer_nmt.model.positional import sinusoidal_encoding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peer_training import PEERS, REPO, piece_names  # noqa: E402
from harness import machine  # noqa: E402

OUT = REPO / "benchmarks" / "out" / "peer_decoding_eole.json"
EOLE_POSITIONS = 5000  # rows of eole's sinusoid buffers (its default max_len)


def check_convertible(config: dict[str, Any]) -> None:
    """Exit with the reason when eole's transformer cannot hold a model of ``config``."""
    problems = []
    if not config["norm_first"]:
        problems.append("a post-LN model (eole's decoder layers are pre-LN only)")
    if config["positional"] != "sinusoidal":
        problems.append(f"positional={config['positional']!r} (eole: sinusoids)")
    if not config["tie_embeddings"]:
        problems.append("untied embeddings")
    if config["d_k"] * config["h"] != config["d_model"] or config["d_v"] != config["d_k"]:
        problems.append("d_k, d_v other than d_model / h")
    if problems:
        sys.exit("cannot convert to eole: " + "; ".join(problems))


def to_eole_state_dict(model: torch.nn.Module, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Our Transformer's weights under eole 0.6's parameter names (pre-LN, tied embeddings)."""
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    d = config["d_model"]
    out: dict[str, torch.Tensor] = {"src_emb.embeddings.weight": ours["src_embed.weight"]}
    pe = sinusoidal_encoding(EOLE_POSITIONS, d)[:, None, :]  # [L, 1, d_model], eole's layout
    out["src_emb.pe.pe"], out["tgt_emb.pe.pe"] = pe, pe.clone()

    def attention(dst: str, src: str, stacked: str, names: tuple[str, ...]) -> None:
        for suffix in ("weight", "bias"):
            key = f"{src}.{stacked}.{suffix}"
            if key in ours:
                for name, part in zip(names, ours[key].split(d, dim=0), strict=True):
                    out[f"{dst}.{name}.{suffix}"] = part
            if f"{src}.w_o.{suffix}" in ours:
                out[f"{dst}.final_linear.{suffix}"] = ours[f"{src}.w_o.{suffix}"]
            if f"{src}.w_q.{suffix}" in ours:
                out[f"{dst}.linear_query.{suffix}"] = ours[f"{src}.w_q.{suffix}"]

    def copy(dst: str, src: str) -> None:
        for suffix in ("weight", "bias"):
            if f"{src}.{suffix}" in ours:
                out[f"{dst}.{suffix}"] = ours[f"{src}.{suffix}"]

    qkv = ("linear_query", "linear_keys", "linear_values")
    for i in range(config["N"]):
        e, o = f"encoder.transformer_layers.{i}", f"encoder_layers.{i}"
        copy(f"{e}.input_layernorm", f"{o}.res_attn.norm")
        attention(f"{e}.self_attn", f"{o}.self_attn", "w_qkv", qkv)
        copy(f"{e}.post_attention_layernorm", f"{o}.res_ffn.norm")
        copy(f"{e}.mlp.gate_up_proj", f"{o}.ffn.w_1")
        copy(f"{e}.mlp.down_proj", f"{o}.ffn.w_2")

        e, o = f"decoder.transformer_layers.{i}", f"decoder_layers.{i}"
        copy(f"{e}.input_layernorm", f"{o}.res_self.norm")
        attention(f"{e}.self_attn", f"{o}.self_attn", "w_qkv", qkv)
        copy(f"{e}.precontext_layernorm", f"{o}.res_cross.norm")
        attention(f"{e}.context_attn", f"{o}.cross_attn", "w_kv", qkv[1:])
        copy(f"{e}.post_attention_layernorm", f"{o}.res_ffn.norm")
        copy(f"{e}.mlp.gate_up_proj", f"{o}.ffn.w_1")
        copy(f"{e}.mlp.down_proj", f"{o}.ffn.w_2")
        out[f"{e}.layer_scalar"] = torch.ones(1)
    copy("encoder.layer_norm", "encoder_norm")
    copy("decoder.layer_norm", "decoder_norm")
    return out


def eole_config(config: dict[str, Any], vocab_size: int, vocab_file: Path) -> dict[str, Any]:
    """eole's ``config.json`` for a model of our ``config`` (the shape; nothing of training);
    ``vocab_file``: the pieces, one per line (eole's training-time vocabulary, required)."""
    shape = {
        "layers": config["N"],
        "hidden_size": config["d_model"],
        "heads": config["h"],
        "transformer_ff": config["d_ff"],
        "mlp_activation_fn": "relu",
        "layer_norm": "standard",
        "norm_eps": config["ln_eps"],
        "add_qkvbias": config["attention_bias"],
        "add_ffnbias": True,
        "position_encoding_type": "SinusoidalInterleaved",
    }
    return {
        "src_vocab": str(vocab_file),
        "tgt_vocab": str(vocab_file),
        "src_vocab_size": vocab_size,
        "tgt_vocab_size": vocab_size,
        "vocab_size_multiple": 1,
        "share_vocab": True,
        "decoder_start_token": "<s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "transforms": [],
        "training": {"compute_dtype": "torch.float32"},
        "model": {
            "architecture": "transformer",
            **shape,
            "word_vec_size": config["d_model"],
            "share_embeddings": True,
            "share_decoder_embeddings": True,
            "generator_bias": False,
            "embeddings": {
                "position_encoding": True,
                "position_encoding_type": "SinusoidalInterleaved",
                "word_vec_size": config["d_model"],
                "src_word_vec_size": config["d_model"],
                "tgt_word_vec_size": config["d_model"],
            },
            "encoder": {"encoder_type": "transformer", **shape},
            "decoder": {"decoder_type": "transformer", "with_cross_attn": True, **shape},
        },
    }


def vocabulary(translator: Translator) -> list[str]:
    """Our pieces by id, as the training benchmark gives them to eole; our specials' ids."""
    names = piece_names(translator.spm_model_path)
    specials = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
    for i, name in specials.items():
        if names[i] != name:
            sys.exit(f"{translator.spm_model_path}: id {i} is {names[i]!r}, expected {name!r}")
    return names


def time_ours(translator: Translator, lines: list[str], runs: int) -> dict[str, Any]:
    translator.translate(lines)  # warm-up
    wall, cpu, outputs = [], [], []
    for _ in range(runs):
        start, cpu_start = time.perf_counter(), time.process_time()
        outputs = translator.translate(lines)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return {"wall_seconds": wall, "cpu_seconds": cpu, "outputs": outputs}


def time_eole(args, model_dir: Path, weights: Path | None, pieces: Path, max_length: int,
              threads: int, out: Path) -> dict[str, Any]:  # fmt: skip
    cmd = [
        str(args.peer_venv / "bin" / "python"), str(PEERS / "eole_decode.py"),
        "--model-dir", str(model_dir), "--source", str(pieces), "--output", str(out),
        "--beam", str(args.beam), "--alpha", str(args.alpha), "--max-length", str(max_length),
        "--batch-tokens", str(args.max_tokens), "--threads", str(threads), "--runs", str(args.runs),
    ]  # fmt: skip
    if weights is not None:
        cmd += ["--weights", str(weights)]
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = str(threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not result:
        sys.exit(f"eole_decode.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result[-1][len("RESULT ") :])


def bleu(hyps: list[str], refs: list[str] | None) -> float | None:
    if refs is None:
        return None
    import sacrebleu

    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="our model file (averaged.pt)")
    parser.add_argument("--spm-model", type=Path, required=True)
    parser.add_argument("--source", type=Path, required=True, help="source text, one per line")
    parser.add_argument("--reference", type=Path, help="reference text: BLEU of both outputs")
    parser.add_argument("--sentences", type=int, default=0, help="first N lines (0 = all)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    add_search_arguments(parser)  # translate's own flags and §6.1 defaults
    parser.add_argument("--peer-venv", type=Path, default=REPO / "benchmarks" / ".venv-peer-eole")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not (args.peer_venv / "bin" / "eole").exists():
        sys.exit(f"{args.peer_venv}: no eole there; run benchmarks/peers/install_eole.sh")

    lines = read_lines(args.source)
    refs = read_lines(args.reference) if args.reference else None
    if args.sentences:
        lines = lines[: args.sentences]
        refs = refs[: args.sentences] if refs else None
    settings = search_settings(args)
    translator = Translator(args.model, args.spm_model, settings=settings)
    config = dict(translator.meta["model_config"])
    check_convertible(config)
    names = vocabulary(translator)

    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = tmp / "eole_model"
        model_dir.mkdir()
        vocab_file = model_dir / "vocab.txt"
        vocab_file.write_text("".join(f"{name}\t1\n" for name in names), encoding="utf-8")
        eole_cfg = eole_config(config, len(names), vocab_file)
        (model_dir / "config.json").write_text(json.dumps(eole_cfg))
        vocab = {
            "src": names, "tgt": names, "decoder_start_token": "<s>",
            "specials": {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>",
                         "eos_token": "</s>"},
        }  # fmt: skip
        (model_dir / "vocab.json").write_text(json.dumps(vocab))
        weights = tmp / "weights.pt"
        torch.save(to_eole_state_dict(translator.model, config), weights)
        # the same pieces as our encoder sees, + </s> (our sources are x EOS)
        ids = [translator.encode(line).tolist() for line in lines]
        pieces = tmp / "source.pieces"
        pieces.write_text("".join(" ".join([*(names[i] for i in s), "</s>"]) + "\n" for s in ids))
        max_length = max(len(s) + 1 for s in ids) + args.max_len_b  # our cap: |x EOS| + b
        by_name = {n: i for i, n in enumerate(names)}  # eole's output pieces -> our ids

        for threads in args.threads:
            torch.set_num_threads(threads)
            load = os.getloadavg()[0]
            ours = time_ours(translator, lines, args.runs)
            peer_out = tmp / "peer.hyp"
            peer = time_eole(args, model_dir, weights, pieces, max_length, threads, peer_out)
            weights = None  # saved into the model directory by the first call
            peer_pieces = peer_out.read_text(encoding="utf-8").splitlines()
            peer_text = [
                translator.decode([by_name[p] for p in line.split() if p in by_name])
                for line in peer_pieces
            ]
            same = sum(a == b for a, b in zip(ours["outputs"], peer_text, strict=True))
            n = len(lines)
            row = {
                "threads": threads,
                "load_1min": load,
                "ours_sentences_per_s": n / statistics.median(ours["wall_seconds"]),
                "peer_sentences_per_s": n / statistics.median(peer["wall_seconds"]),
                "ours_sentences_per_cpu_s": n / statistics.median(ours["cpu_seconds"]),
                "peer_sentences_per_cpu_s": n / statistics.median(peer["cpu_seconds"]),
                "identical_outputs": same / n,
                "ours_bleu": bleu(ours["outputs"], refs),
                "peer_bleu": bleu(peer_text, refs),
                "ours_wall_seconds": ours["wall_seconds"],
                "peer_wall_seconds": peer["wall_seconds"],
            }
            row["ratio"] = row["ours_sentences_per_s"] / row["peer_sentences_per_s"]
            row["cpu_ratio"] = row["ours_sentences_per_cpu_s"] / row["peer_sentences_per_cpu_s"]
            rows.append(row)
            print(
                f"threads {threads}: ours {row['ours_sentences_per_s']:.1f} sent/s, eole "
                f"{row['peer_sentences_per_s']:.1f} sent/s: {row['ratio']:.2f}x "
                f"({row['cpu_ratio']:.2f}x per CPU-s); identical {100 * same / n:.1f} %; "
                f"BLEU ours {row['ours_bleu']} eole {row['peer_bleu']}; load {load:.2f}",
                flush=True,
            )

    version = subprocess.run(
        [str(args.peer_venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('eole'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print(f"\n{len(lines)} sentences, beam {args.beam}, alpha {args.alpha}, median of "
          f"{args.runs} runs; peer eole {version}")  # fmt: skip
    print(f"{'threads':>7} {'ours sent/s':>12} {'eole sent/s':>12} {'ratio':>6} "
          f"{'per CPU-s':>10} {'identical':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['threads']:>7} {r['ours_sentences_per_s']:>12.1f} "
              f"{r['peer_sentences_per_s']:>12.1f} {r['ratio']:>5.2f}x "
              f"{r['cpu_ratio']:>9.2f}x {100 * r['identical_outputs']:>9.1f}%")  # fmt: skip
    write_json(
        args.out,
        {
            "benchmark": "peer_decoding",
            "peer": f"eole {version}",
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": machine(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "sentences": len(lines),
            "rows": rows,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
