"""§5.4 label-smoothed cross-entropy: the loss of given logits, its chunked, projected and fused
forms, and the one a training step takes (``model_loss``, ``loss_path``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_nmt.training.objective import (
    chunked_label_smoothed_cross_entropy,
    label_smoothed_cross_entropy,
    loss_path,
    model_loss,
    projected_label_smoothed_cross_entropy,
)


def test_label_smoothing_matches_hand_computation():
    # One position, V = 3, target 0: q = (1 - eps) * one_hot + eps / V.
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    target = torch.tensor([[0]])
    z = math.log(math.exp(2.0) + math.exp(0.0) + math.exp(-1.0))
    logp = [2.0 - z, 0.0 - z, -1.0 - z]
    eps = 0.1
    q = [1 - eps + eps / 3, eps / 3, eps / 3]
    expected = -sum(qi * lp for qi, lp in zip(q, logp, strict=True))
    out = label_smoothed_cross_entropy(logits, target, eps=eps, pad_id=99)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.nll.item() == pytest.approx(-logp[0], rel=1e-6)
    assert out.ntokens.item() == 1


def test_padding_is_ignored_and_sums_match_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g)
    target = torch.randint(1, 7, (2, 4), generator=g)
    target[0, 2:] = 0
    out = label_smoothed_cross_entropy(logits, target, eps=0.1, pad_id=0)
    flat_logits, flat_target = logits.view(-1, 7), target.view(-1)
    ref = F.cross_entropy(
        flat_logits, flat_target, ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    ref_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=0, reduction="sum")
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(out.nll, ref_nll)
    assert out.ntokens.item() == 6
    # changing the logits at padded positions changes nothing
    logits2 = logits.clone()
    logits2[0, 2:] = 100.0
    torch.testing.assert_close(label_smoothed_cross_entropy(logits2, target).loss, out.loss)


def test_no_smoothing_is_plain_nll_and_bf16_logits_are_computed_in_float32():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 11, generator=g).to(torch.bfloat16)
    target = torch.randint(1, 11, (3, 5), generator=g)
    out = label_smoothed_cross_entropy(logits, target, eps=0.0, pad_id=0)
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, out.nll)
    ref = F.cross_entropy(logits.float().view(-1, 11), target.view(-1), reduction="sum")
    torch.testing.assert_close(out.nll, ref)


@pytest.mark.parametrize("rows_per_chunk", [4, 256])
def test_gradients_equal_autograd_through_torch_cross_entropy(monkeypatch, rows_per_chunk):
    """The loss's written-out gradient (softmax - q per kept row) equals autograd's through
    F.cross_entropy(label_smoothing), in one row chunk or many (15 rows: the last chunk is
    shorter); padded rows get none, and the logits are left as they were (the chunks are
    computed in place in a buffer of copies)."""
    from transformer_nmt.training import loss_kernels

    monkeypatch.setattr(loss_kernels, "CPU_LOSS_ROWS", rows_per_chunk)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 13, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 5), generator=g)
    target[1, 3:] = 0
    before = logits.detach().clone()
    out = label_smoothed_cross_entropy(logits, target, eps=0.1, pad_id=0)
    (2.5 * out.loss).backward()
    assert torch.equal(logits.detach(), before)
    ours = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(
        logits.view(-1, 13), target.view(-1), ignore_index=0, label_smoothing=0.1,
        reduction="sum",
    )  # fmt: skip
    (2.5 * ref).backward()
    torch.testing.assert_close(out.loss, ref.detach())
    torch.testing.assert_close(ours, logits.grad)
    assert ours[1, 3:].abs().sum() == 0
    assert not out.nll.requires_grad  # the NLL is logged, never optimised
    check = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    tgt = torch.tensor([[1], [2], [0], [5]])  # one padded row
    assert torch.autograd.gradcheck(
        lambda x: label_smoothed_cross_entropy(x, tgt, eps=0.2, pad_id=0).loss, (check,)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fused_loss_equals_the_eager_one(device, dtype):
    """``fused`` (train.compile on a GPU): the torch.compile'd passes over the logits give the
    eager loss, NLL and gradient (in the logits' dtype) for batches of two row counts (one
    compiled kernel for both: dynamic shapes), padded rows included. On a CPU inductor builds
    C++ of the same graph it builds Triton kernels of on a GPU."""
    import shutil

    if device == "cpu" and shutil.which("g++") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's CPU backend (inductor) needs a C++ compiler; none found")
    g = torch.Generator().manual_seed(5)
    for rows in (7, 12):
        logits = (3 * torch.randn(2, rows, 101, generator=g)).to(device, dtype)
        target = torch.randint(1, 101, (2, rows), generator=g).to(device)
        target[1, rows - 3 :] = 0  # padding
        results = []
        for fused in (False, True):
            x = logits.detach().clone().requires_grad_()
            out = label_smoothed_cross_entropy(x, target, eps=0.1, pad_id=0, fused=fused)
            (0.5 * out.loss).backward()
            assert x.grad.dtype == dtype
            results.append((out.loss.detach(), out.nll, x.grad))
        (loss, nll, grad), (fused_loss, fused_nll, fused_grad) = results
        torch.testing.assert_close(fused_loss, loss)
        torch.testing.assert_close(fused_nll, nll)
        torch.testing.assert_close(fused_grad, grad)
        assert fused_grad[1, rows - 3 :].abs().sum() == 0


def test_a_failed_loss_compile_warns_once_and_the_eager_loss_serves(monkeypatch):
    """A node where torch.compile fails (e.g. no C compiler for Triton): one warning naming
    train.fused_loss, the eager loss's numbers, and no second attempt in the process."""
    from transformer_nmt.training import loss_kernels

    attempts = []

    def failing(function):  # noqa: ANN001, ANN202
        def run(*args):  # noqa: ANN002, ANN202
            attempts.append(function.__name__)
            raise RuntimeError("backend='inductor' raised:\nno C compiler found")

        return run

    monkeypatch.setattr(loss_kernels, "_compiled", failing)
    monkeypatch.setattr(loss_kernels, "_COMPILE_FAILED", [])
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 4, 17, generator=g)
    target = torch.randint(1, 17, (3, 4), generator=g)
    eager = label_smoothed_cross_entropy(logits, target)
    x = logits.clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match=r"train\.fused_loss: .*no C compiler found"):
        out = label_smoothed_cross_entropy(x, target, fused=True)
    out.loss.backward()
    again = label_smoothed_cross_entropy(logits, target, fused=True)
    assert attempts == ["_row_statistics"]
    torch.testing.assert_close(out.loss, eager.loss)
    torch.testing.assert_close(again.nll, eager.nll)
    x_eager = logits.clone().requires_grad_()
    label_smoothed_cross_entropy(x_eager, target).loss.backward()
    torch.testing.assert_close(x.grad, x_eager.grad)


def test_fused_loss_auto_is_on_for_cuda_with_triton_only(monkeypatch):
    from transformer_nmt.training import objective

    have_triton = {"triton": True}
    monkeypatch.setattr(
        objective.importlib.util, "find_spec", lambda name: object() if have_triton[name] else None
    )
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    objective._triton_installed.cache_clear()  # looked up once per process
    assert objective.fused_loss_wanted("auto", cuda)
    assert not objective.fused_loss_wanted("auto", cpu)
    assert objective.fused_loss_wanted(True, cpu) and not objective.fused_loss_wanted(False, cuda)
    have_triton["triton"] = False
    objective._triton_installed.cache_clear()
    assert not objective.fused_loss_wanted("auto", cuda)
    objective._triton_installed.cache_clear()  # later tests ask the real question


def test_bf16_logits_get_a_bf16_gradient_close_to_the_float32_one():
    g = torch.Generator().manual_seed(4)
    base = torch.randn(4, 6, 50, generator=g)
    target = torch.randint(1, 50, (4, 6), generator=g)
    grads = []
    for dtype in (torch.float32, torch.bfloat16):
        logits = base.to(dtype).detach().requires_grad_()
        label_smoothed_cross_entropy(logits, target).loss.backward()
        assert logits.grad.dtype == dtype
        grads.append(logits.grad.float())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-2, rtol=2e-2)


def _projection_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection matrix [V=13, d=6], decoder outputs [3, 5, 6] (float64, with gradients) and
    targets [3, 5] with 9 real tokens (rows 1 and 2 padded at their ends)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(13, 6, generator=g, dtype=torch.float64, requires_grad=True)  # [V, d]
    hidden = torch.randn(3, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 5), generator=g)
    target[1, 3:] = 0
    target[2, 1:] = 0
    return weight, hidden, target


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 1000])
def test_chunked_loss_and_gradients_equal_the_full_logits(chunk_tokens):
    """The ``train.loss_chunk_tokens`` path: the same loss, NLL and gradients (of the decoder
    output and of the projection matrix) as projecting every position at once."""
    weight, hidden, target = _projection_case(seed=2)

    def project(x):
        return x @ weight.T

    full = label_smoothed_cross_entropy(project(hidden), target, eps=0.1, pad_id=0)
    grads = torch.autograd.grad(full.loss, (hidden, weight))
    out = chunked_label_smoothed_cross_entropy(
        hidden, project, target, chunk_tokens=chunk_tokens, eps=0.1, pad_id=0
    )
    torch.testing.assert_close(out.loss, full.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(out.nll, full.nll, rtol=1e-12, atol=0)
    assert out.ntokens.item() == full.ntokens.item() == 9
    for got, expected in zip(torch.autograd.grad(out.loss, (hidden, weight)), grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)
    # padding positions get no gradient
    again = chunked_label_smoothed_cross_entropy(hidden, project, target, chunk_tokens=chunk_tokens)
    (grad_hidden,) = torch.autograd.grad(again.loss, hidden)
    assert torch.count_nonzero(grad_hidden[2, 1:]) == 0 and torch.count_nonzero(grad_hidden[0]) > 0
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_label_smoothed_cross_entropy(hidden, project, target, chunk_tokens=0)


@pytest.mark.parametrize("rows_per_chunk", [4, 256])
def test_projected_loss_and_gradients_equal_the_full_logits(monkeypatch, rows_per_chunk):
    """The ``projected_loss`` fast path (the gradient computed beside the loss, chunk by chunk
    of rows, no [n, V] logits): the loss, NLL and gradients of the decoder output and of the
    projection matrix equal the logits path's, scaled by the incoming gradient; in one chunk
    or several (9 real rows: the last chunk shorter), padding positions get no gradient."""
    from transformer_nmt.training import loss_kernels

    monkeypatch.setattr(loss_kernels, "PROJECTED_LOSS_ELEMENTS", rows_per_chunk * 13)  # V = 13
    weight, hidden, target = _projection_case(seed=4)
    g = torch.Generator().manual_seed(5)
    full = label_smoothed_cross_entropy(hidden @ weight.T, target, eps=0.1, pad_id=0)
    grads = torch.autograd.grad(2.5 * full.loss, (hidden, weight))
    out = projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1, pad_id=0)
    torch.testing.assert_close(out.loss, full.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(out.nll, full.nll, rtol=1e-12, atol=0)
    assert out.ntokens.item() == full.ntokens.item() == 9
    assert not out.nll.requires_grad  # the NLL is logged, never optimised
    got = torch.autograd.grad(2.5 * out.loss, (hidden, weight))
    for ours, expected in zip(got, grads, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-15)
    assert torch.count_nonzero(got[0][2, 1:]) == 0 and torch.count_nonzero(got[0][2, 0]) > 0
    # without autograd: the same sums, no gradient computed
    with torch.no_grad():
        plain = projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1, pad_id=0)
    torch.testing.assert_close(plain.loss, full.loss.detach(), rtol=1e-12, atol=0)
    assert not plain.loss.requires_grad
    check_h = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    check_w = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    tgt = torch.tensor([1, 2, 0, 5])  # one padded row
    assert torch.autograd.gradcheck(
        lambda h, w: projected_label_smoothed_cross_entropy(h, w, tgt, eps=0.2, pad_id=0).loss,
        (check_h, check_w),
    )


def test_the_loss_path_a_step_takes(monkeypatch):
    """``loss_path``: the projected fast path on a CPU without autocast or under bf16
    autocast, unless chunked, compiled, fused or switched off; the logits path under fp16
    autocast and on a GPU."""
    from transformer_nmt.fast_paths import ENV

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setenv(ENV, "on")
    assert loss_path(cpu, fused=False, compiled=False, autocast=False) == "projected"
    assert loss_path(cpu, fused=False, compiled=False, autocast=torch.bfloat16) == "projected"
    assert loss_path(cpu, fused=False, compiled=False, autocast=torch.float16) == "logits"
    with pytest.raises(ValueError, match="autocast's dtype"):
        loss_path(cpu, fused=False, compiled=False, autocast=True)
    assert loss_path(cpu, fused=False, compiled=True, autocast=False) == "logits"
    assert loss_path(cpu, fused=True, compiled=False, autocast=False) == "fused"
    assert loss_path(cuda, fused=True, compiled=False, chunked=True) == "chunked"
    assert loss_path(cuda, fused=False, compiled=False, autocast=False) == "logits"
    bf16_true = {"autocast": False, "dtype": torch.bfloat16}  # bf16 weights: softmax in float32
    assert loss_path(cpu, fused=False, compiled=False, **bf16_true) == "logits"
    assert loss_path(cpu, fused=False, compiled=False, autocast=False, dtype=torch.float64) == (
        "projected"
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert loss_path(cpu, fused=False, compiled=False) == "projected"
        assert loss_path(cuda, fused=False, compiled=False) == "logits"
    with torch.autocast("cpu", dtype=torch.float16):
        assert loss_path(cpu, fused=False, compiled=False) == "logits"
    assert loss_path(cpu, fused=False, compiled=False) == "projected"
    monkeypatch.setenv(ENV, "allocator,row_topk")
    assert loss_path(cpu, fused=False, compiled=False, autocast=False) == "logits"


@pytest.mark.parametrize("fast_path", ["on", "off"])
def test_model_loss_equals_the_logits_of_the_model(monkeypatch, fast_path):
    """``model_loss`` on a small Transformer (tied and untied projection): the same loss and
    parameter gradients through the projected fast path as through the model's logits."""
    from transformer_nmt.fast_paths import ENV

    monkeypatch.setenv(ENV, fast_path)
    for tie in (True, False):
        model, batch = _tiny_transformer(p_drop=0.0, tie_embeddings=tie)
        ref = label_smoothed_cross_entropy(model(batch["src"], batch["tgt_in"]), batch["tgt_out"])
        ref_grads = torch.autograd.grad(ref.loss, list(model.parameters()), allow_unused=True)
        out = model_loss(model, batch, eps=0.1, pad_id=0)
        got = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=0)
        for ours, expected in zip(got, ref_grads, strict=True):
            torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_tokens", [None, 4])
def test_model_loss_takes_the_path_its_settings_name_with_their_eps(monkeypatch, chunk_tokens):
    """``train.loss_chunk_tokens`` sends ``model_loss`` through the chunked loss (the same
    numbers, so the call itself is checked), and every path smooths with the ``eps`` given, not
    a default."""
    from transformer_nmt.fast_paths import ENV
    from transformer_nmt.training import objective

    monkeypatch.setenv(ENV, "on")
    calls: list[str] = []
    for name in ("chunked_label_smoothed_cross_entropy", "projected_label_smoothed_cross_entropy"):
        original = getattr(objective, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(objective, name, spy)
    model, batch = _tiny_transformer(p_drop=0.0)
    logits = model(batch["src"], batch["tgt_in"])
    for eps in (0.0, 0.3):
        calls.clear()
        out = model_loss(model, batch, eps=eps, pad_id=0, chunk_tokens=chunk_tokens)
        ref = label_smoothed_cross_entropy(logits, batch["tgt_out"], eps=eps, pad_id=0)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-10, atol=0)
        expected = "chunked" if chunk_tokens else "projected"
        assert calls == [f"{expected}_label_smoothed_cross_entropy"]


def _bf16_grid(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """float32 values k / 8, |k| <= 4: their products' sums over <= 16 terms are multiples of
    1/64 below 4 in size, exact in float32 and in bf16 (8 significant bits), so bf16 products
    give exactly the logits float32 ones do, whatever the summation order."""
    return torch.randint(-4, 5, shape, generator=generator).float() / 8


@pytest.mark.parametrize(("rows_per_chunk", "row_multiple"), [(3, 2), (256, 4), (256, 64)])
def test_projected_loss_under_bf16_autocast_equals_the_logits_path(
    monkeypatch, rows_per_chunk, row_multiple
):
    """Under bf16 autocast (the bf16-mixed step on a CPU) the projected fast path multiplies in
    bf16 and gives the logits path's loss and NLL (the logits are exact here, so only float32
    summation order differs) and its gradients up to the bf16 rounding of softmax(x) - q, which
    both paths round once (one bf16 ulp, 2^-8 relative, per element): in one chunk or several,
    with padding positions, and with the zero rows that pad the 9 real ones to a multiple of
    ``BF16_PROJECTED_ROWS`` (1, 3 and 55 of them)."""
    from transformer_nmt.training import loss_kernels

    vocab, d = 11, 16
    monkeypatch.setattr(loss_kernels, "PROJECTED_LOSS_ELEMENTS", rows_per_chunk * vocab)
    monkeypatch.setattr(loss_kernels, "BF16_PROJECTED_ROWS", row_multiple)
    g = torch.Generator().manual_seed(8)
    weight = _bf16_grid((vocab, d), g).requires_grad_()
    hidden = _bf16_grid((3, 5, d), g).requires_grad_()
    target = torch.randint(1, vocab, (3, 5), generator=g)
    target[1, 3:] = 0
    target[2, 1:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(hidden, weight)  # [3, 5, V], bf16
        full = label_smoothed_cross_entropy(logits, target, eps=0.1, pad_id=0)
        out = projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1, pad_id=0)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss, full.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.nll, full.nll, rtol=1e-6, atol=0)
    expected = torch.autograd.grad(3.0 * full.loss, (hidden, weight))
    got = torch.autograd.grad(3.0 * out.loss, (hidden, weight))
    # softmax(x) - q per position, in float64 from the exact logits: the bound's |g|
    keep = target != 0
    x = (hidden.detach().double() @ weight.detach().double().T)[keep]  # [9, V]
    q = torch.full_like(x, 0.1 / vocab)
    q[torch.arange(x.shape[0]), target[keep]] += 0.9
    g_abs = 3.0 * (x.softmax(-1) - q).abs()  # [9, V]
    ulp = 2.0**-7  # the gap between bf16 neighbours relative to the smaller one, at most
    bound_hidden = torch.zeros_like(hidden, dtype=torch.float64)
    bound_hidden[keep] = ulp * g_abs @ weight.detach().double().abs()
    bound_weight = ulp * g_abs.T @ hidden.detach().double()[keep].abs()
    for ours, reference, bound in zip(got, expected, (bound_hidden, bound_weight), strict=True):
        assert ours.dtype == torch.float32
        error = (ours.double() - reference.double()).abs()
        # each path rounds its product's result to bf16 once more (the reference: the whole
        # d loss / d W; ours: each chunk's, summed in float32)
        assert (error <= bound + ulp * reference.double().abs() * 2).all()
        assert reference.abs().sum() > 0
    assert torch.count_nonzero(got[0][2, 1:]) == 0  # padding gets no gradient


def test_projected_loss_under_bf16_autocast_multiplies_in_bf16(monkeypatch):
    """The bf16 products are those the logits path's bf16 projection makes: every product of
    the projected pass under bf16 autocast takes bf16 operands, and none does without it."""
    seen: list[tuple[torch.dtype, ...]] = []
    mm = torch.mm

    def recording_mm(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(tuple(a.dtype for a in args[:2]))
        return mm(*args, **kwargs)

    weight, hidden, target = _projection_case(seed=6)
    weight, hidden = weight.detach().float(), hidden.detach().float().requires_grad_()
    monkeypatch.setattr(torch, "mm", recording_mm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1, pad_id=0)
    # x, d loss / d h and d loss / d W (one chunk)
    assert len(seen) == 3 and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    seen.clear()
    projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1, pad_id=0)
    assert seen and set(seen) == {(torch.float32, torch.float32)}
    assert out.loss.dtype == torch.float32


def test_bf16_projected_products_come_in_few_shapes(monkeypatch):
    """oneDNN keeps every bf16 product shape it meets: under bf16 autocast the projected loss's
    products have row counts that are multiples of ``BF16_PROJECTED_ROWS`` and at most the
    chunk's, whatever the batch's token count, so a run meets a bounded set of shapes."""
    from transformer_nmt.training import loss_kernels

    vocab, d, multiple, chunk = 13, 6, 4, 12
    monkeypatch.setattr(loss_kernels, "PROJECTED_LOSS_ELEMENTS", (chunk + 1) * vocab)
    monkeypatch.setattr(loss_kernels, "BF16_PROJECTED_ROWS", multiple)
    shapes: set[tuple[int, ...]] = set()
    mm = torch.mm

    def recording_mm(a, b, **kwargs):  # type: ignore[no-untyped-def]
        shapes.add((*a.shape, *b.shape))
        return mm(a, b, **kwargs)

    monkeypatch.setattr(torch, "mm", recording_mm)
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(vocab, d, generator=g, requires_grad=True)
    for n in range(1, 40):
        hidden = torch.randn(1, n, d, generator=g, requires_grad=True)
        target = torch.randint(1, vocab, (1, n), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = projected_label_smoothed_cross_entropy(hidden, weight, target, eps=0.1)
        out.loss.backward()
    rows = {count for shape in shapes for count in shape if count not in (vocab, d)}
    assert rows == {4, 8, 12}  # 39 token counts, 3 row counts


def test_model_loss_under_bf16_autocast_equals_the_logits_of_the_model(monkeypatch):
    """``model_loss`` under bf16 autocast (a bf16-mixed CPU step): the projected fast path gives
    the loss and parameter gradients of the model's bf16 logits path (fast path off), up to
    bf16 rounding: the loss to float32 summation order, each gradient to a few bf16 ulps of
    its norm."""
    from transformer_nmt.fast_paths import ENV

    results = {}
    for fast_path in ("on", "off"):
        monkeypatch.setenv(ENV, fast_path)
        model, batch = _tiny_transformer(p_drop=0.0, tie_embeddings=True)
        model.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert loss_path(torch.device("cpu"), fused=False, compiled=False) == (
                "projected" if fast_path == "on" else "logits"
            )
            out = model_loss(model, batch, eps=0.1, pad_id=0)
        grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
        results[fast_path] = out.loss.detach(), grads
    (loss, grads), (ref_loss, ref_grads) = results["on"], results["off"]
    torch.testing.assert_close(loss, ref_loss, rtol=2.0**-8, atol=0)
    for ours, expected in zip(grads, ref_grads, strict=True):
        if expected is None:
            assert ours is None
            continue
        assert torch.linalg.vector_norm(ours - expected) <= 4 * 2.0**-8 * torch.linalg.vector_norm(
            expected
        )


def _tiny_transformer(p_drop: float, tie_embeddings: bool = True):
    """A float64 one-layer Transformer over 29 ids and a batch of 3 x 6 (one target padded)."""
    from transformer_nmt.model.config import get_preset
    from transformer_nmt.model.transformer import Transformer

    cfg = dataclasses.replace(
        get_preset("tiny"), d_model=16, d_ff=32, h=2, d_k=8, d_v=8, N=1, p_drop=p_drop,
        tie_embeddings=tie_embeddings,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=29, pad_id=0).double()
    g = torch.Generator().manual_seed(5)
    batch = {key: torch.randint(1, 29, (3, 6), generator=g) for key in ("src", "tgt_in")}
    batch["tgt_out"] = torch.randint(1, 29, (3, 6), generator=g)
    batch["tgt_out"][0, 4:] = 0
    return model, batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_kernels_run_eagerly_give_the_chunked_loss_and_gradient(monkeypatch, dtype):
    """The fused loss's two kernels (``_row_statistics``, ``_row_gradient``) as plain torch, with
    torch.compile replaced by the function itself: the same loss, NLL and gradient as the
    chunked eager passes, padded rows included and more rows than one chunk. This checks the
    kernels' arithmetic wherever inductor cannot build them (no compiler, or instrumented
    code); the compiled kernels are checked by ``test_fused_loss_equals_the_eager_one``."""
    from transformer_nmt.training import loss_kernels

    compiled = []

    def as_compiled(function):  # noqa: ANN001, ANN202
        compiled.append(function.__name__)
        return function

    monkeypatch.setattr(loss_kernels, "_compiled", as_compiled)
    monkeypatch.setattr(loss_kernels, "_COMPILE_FAILED", [])
    monkeypatch.setattr(loss_kernels, "CPU_LOSS_ROWS", 5)  # 3 chunks of the 13 rows
    g = torch.Generator().manual_seed(8)
    logits = (3 * torch.randn(1, 13, 37, generator=g)).to(dtype)
    target = torch.randint(1, 37, (1, 13), generator=g)
    target[0, 10:] = 0  # padding
    results = []
    for fused in (False, True):
        x = logits.detach().clone().requires_grad_()
        out = label_smoothed_cross_entropy(x, target, eps=0.2, pad_id=0, fused=fused)
        (0.5 * out.loss).backward()
        results.append((out.loss.detach(), out.nll, x.grad))
    (loss, nll, grad), (fused_loss, fused_nll, fused_grad) = results
    assert compiled == ["_row_statistics", "_row_gradient"]
    assert not loss_kernels._COMPILE_FAILED
    torch.testing.assert_close(fused_loss, loss)
    torch.testing.assert_close(fused_nll, nll)
    assert fused_grad.dtype == dtype
    torch.testing.assert_close(fused_grad, grad)
    assert fused_grad[0, 10:].abs().sum() == 0
