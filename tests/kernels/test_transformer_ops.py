"""Bias+GeLU, LayerNorm and causal softmax (C++ CPU kernels and Triton under the interpreter): forward and
backward against the fp64 reference differentiated by autograd; custom-op registration checked with
``torch.library.opcheck`` (schema, fake/meta implementation, autograd) and a ``torch.compile`` round trip."""

import math

import pytest
import torch

import kernels
from kernels import ops, reference
from tests.kernels.impls import IMPLS, bias_gelu_fwd_bwd, causal_softmax_fwd_bwd, layer_norm_fwd_bwd, make

TOL = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-5),
}
"""``torch.testing.assert_close``'s own tolerances for each dtype."""

DTYPES = [torch.float32, torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)]


def _ref_grads(fn, inputs, dy, dtype=torch.float64):
    """The output and input gradients of ``fn`` computed by torch's autograd in ``dtype`` (fp64: the reference)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in inputs]
    y = fn(*leaves)
    y.backward(dy.to(dtype))
    return [y.detach()] + [t.grad for t in leaves]


def _close(got, want, dtype):
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, **TOL[dtype])


def _close_as_eager(got, want, eager, dtype):
    """Outputs a kernel computes from rounded intermediates (a bias gradient summed over rounded rows, softmax's
    gradient from its rounded output) are as far from the fp64 reference as torch's eager op in the same dtype is:
    at most twice its largest error, or within the dtype's tolerance (as OpInfo's per-op tolerance overrides)."""
    for g, w, e in zip(got, want, eager):
        fused, torchs = (g.double() - w).abs().max().item(), (e.double() - w).abs().max().item()
        if fused > 2 * torchs:
            torch.testing.assert_close(g.double(), w, **TOL[dtype])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu(impl, approximate, dtype):
    x, b, dy = make((6, 5, 96), dtype, 1, 2.0), make(96, dtype, 2), make((6, 5, 96), dtype, 3)
    got = bias_gelu_fwd_bwd(impl, x, b, dy, approximate)
    fn = lambda x, b: reference.bias_gelu(x, b, approximate)  # noqa: E731
    want = _ref_grads(fn, [x, b], dy)
    _close(got[:2], want[:2], dtype)
    _close_as_eager(got[2:], want[2:], _ref_grads(fn, [x, b], dy, dtype)[2:], dtype)  # db: a sum over 30 rows


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 100])
def test_layer_norm(impl, dtype, n):
    x = make((7, 9, n), dtype, 4, 3.0) + 1.5
    w, b, dy = make(n, dtype, 5) + 1.0, make(n, dtype, 6), make((7, 9, n), dtype, 7)
    got = layer_norm_fwd_bwd(impl, x, w, b, dy, 1e-5)
    fn = lambda x, w, b: reference.layer_norm(x, w, b, 1e-5)  # noqa: E731
    want = _ref_grads(fn, [x, w, b], dy)
    _close(got[:2], want[:2], dtype)
    _close_as_eager(got[2:], want[2:], _ref_grads(fn, [x, w, b], dy, dtype)[2:], dtype)  # dw, db: sums over 63 rows


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [16, 37])
def test_causal_softmax(impl, dtype, s):
    x, dy = make((3, 4, s, s), dtype, 8, 4.0), make((3, 4, s, s), dtype, 9)
    scale = 1 / math.sqrt(32)
    y, dx = causal_softmax_fwd_bwd(impl, x, dy, scale)
    fn = lambda x: reference.causal_softmax(x, scale)  # noqa: E731
    want = _ref_grads(fn, [x], dy)
    _close([y], want[:1], dtype)
    _close_as_eager([dx], want[1:], _ref_grads(fn, [x], dy, dtype)[1:], dtype)  # dx: from the rounded output
    assert not y.float().triu(1).any() and not dx.float().triu(1).any()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_causal_softmax_of_a_row_with_nan_or_inf_is_nan_as_torch_says(impl, bad):
    """torch's softmax makes a whole row NaN, masked entries included, when the row holds a NaN or an inf; the C++
    kernel wrote 0 in the masked entries of such a row (the Triton kernel did not). Rows without one are as
    before."""
    x, dy = make((1, 2, 8, 8), torch.float32, 8, 4.0), make((1, 2, 8, 8), torch.float32, 9)
    x[0, 1, 5, 2] = bad
    y, dx = causal_softmax_fwd_bwd(impl, x, dy, 0.5)
    want_y, want_dx = _ref_grads(lambda x: reference.causal_softmax(x, 0.5), [x], dy)
    torch.testing.assert_close(y.double(), want_y, equal_nan=True, **TOL[torch.float32])
    torch.testing.assert_close(dx.double(), want_dx, equal_nan=True, **TOL[torch.float32])
    assert y[0, 1, 5].isnan().all() and not y[0, 0].isnan().any()


def test_modes_agree_and_reference_mode_never_calls_kernels(monkeypatch):
    x, b = make((4, 32), seed=1), make(32, seed=2)
    fused = kernels.bias_gelu(x, b, mode="fused")
    monkeypatch.setattr(ops, "bias_gelu_op", lambda *a: pytest.fail("reference mode called the kernel"))
    torch.testing.assert_close(kernels.bias_gelu(x, b, mode="reference"), fused, rtol=1e-5, atol=1e-6)


def _opcheck_cases():
    x3 = make((2, 3, 16), seed=1).requires_grad_()
    w, b = (make(16, seed=2) + 1).requires_grad_(), make(16, seed=3).requires_grad_()
    sc = make((2, 2, 8, 8), seed=4).requires_grad_()
    return [
        (ops.bias_gelu_op, (x3, b, "none")),
        (ops.bias_gelu_op, (x3, b, "tanh")),
        (ops.layer_norm_op, (x3, w, b, 1e-5)),
        (ops.causal_softmax_op, (sc, 0.5)),
        (ops.nonfinite_, (make(100), torch.zeros(1))),
        (ops.flat_copy_, (torch.zeros(40), [make(10), make((3, 5))], [0, 16], False)),
        (
            ops.adamw_,
            (
                make(64),
                make(64),
                torch.zeros(64),
                torch.zeros(64),
                torch.empty(64, dtype=torch.bfloat16),
                kernels.adamw_blocks(64, [(0, 32)], "cpu"),
                None,
                1e-3,
                0.9,
                0.95,
                1e-8,
                0.1,
                1,
                1.0,
            ),
        ),
    ]


@pytest.mark.parametrize("case", range(7))
def test_custom_op_registration(case):
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)


def test_composes_with_torch_compile():
    def block(x, w, b, bias):
        h = kernels.layer_norm(x, w, b, mode="fused")
        return kernels.bias_gelu(h, bias, mode="fused").sum()

    args = [make((4, 8, 32), seed=i).requires_grad_() for i in range(1)] + [
        (make(32, seed=2) + 1).requires_grad_(),
        make(32, seed=3).requires_grad_(),
        make(32, seed=4).requires_grad_(),
    ]
    eager = block(*args)
    eager_grads = torch.autograd.grad(eager, args)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)(*args)
    compiled_grads = torch.autograd.grad(compiled, args)
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: kernels.bias_gelu(torch.randn(2, 3, 4), torch.randn(3, 1), mode="fused"), r"bias must be 1-D of x's"),
        (lambda: kernels.bias_gelu(torch.randn(4, 6), torch.randn(4), mode="fused"), r"last dimension \(6\)"),
        (lambda: kernels.layer_norm(torch.randn(3, 6), torch.ones(4), torch.zeros(4), mode="fused"), "weight must"),
        (lambda: kernels.layer_norm(torch.randn(3, 4), torch.ones(4), None, mode="fused"), "bias must .* got None"),
    ],
    ids=["bias-2d", "bias-short", "weight-short", "no-bias"],
)
def test_parameters_not_of_the_last_dimension_are_refused(call, words):
    """The fused bodies index weight and bias by x's last dimension: a (3, 1) bias gave outputs 0.66 off where
    torch broadcasts it, and a short weight was read past its end."""
    with pytest.raises(ValueError, match=words):
        call()


def test_empty_inputs_give_empty_outputs():
    """An empty last dimension (LayerNorm) or sequence (softmax) divided by zero in the fused wrappers; torch returns
    empty tensors."""
    ln = kernels.layer_norm(torch.randn(3, 0), torch.ones(0), torch.zeros(0), mode="fused")
    sm = kernels.causal_softmax(torch.randn(2, 0, 0), 0.5, mode="fused")
    assert ln.shape == (3, 0) and sm.shape == (2, 0, 0)


def test_a_non_contiguous_input_compiles_as_it_runs_eagerly():
    """The fused bias+GeLU returns a contiguous tensor; its fake said the input's strides, so under torch.compile a
    transposed input's result could not be viewed flat (opcheck: "Stride mismatch")."""
    x, b = make((16, 6), seed=1).t(), make(16, seed=2)
    torch.library.opcheck(ops.bias_gelu_op, (x, b, "none"))

    def f(x, b):
        return kernels.bias_gelu(x, b, mode="fused").view(-1)

    torch.testing.assert_close(torch.compile(f, backend="aot_eager", fullgraph=True)(x, b), f(x, b))


@pytest.mark.parametrize("op", ["bias_gelu", "layer_norm", "causal_softmax"])
def test_a_dtype_the_kernels_do_not_compute_in_is_refused_or_takes_the_reference(op):
    """fp64 went through the C++ bodies' fp32 and came back rounded (2e-7 off torch's fp64), while Triton refused it.
    ``auto`` now computes it with torch's ops, and ``fused`` refuses it in one line."""
    x = make((4, 16, 16), seed=1).double()
    w, b = make(16, seed=2).double() + 1, make(16, seed=3).double()
    calls = {
        "bias_gelu": (lambda mode: kernels.bias_gelu(x, b, mode=mode), lambda: reference.bias_gelu(x, b, "none")),
        "layer_norm": (
            lambda mode: kernels.layer_norm(x, w, b, mode=mode),
            lambda: reference.layer_norm(x, w, b, 1e-5),
        ),
        "causal_softmax": (
            lambda mode: kernels.causal_softmax(x, 0.5, mode=mode),
            lambda: reference.causal_softmax(x, 0.5),
        ),
    }
    run, ref = calls[op]
    assert torch.equal(run("auto"), ref())
    with pytest.raises(ValueError, match=r"^the fused kernels compute in fp32, bf16 or fp16, got torch.float64: "):
        run("fused")


def test_a_row_longer_than_a_triton_block_is_refused_or_takes_the_reference(monkeypatch):
    """Triton's LayerNorm and softmax hold one row per block, at most 2^20 elements: a longer row raised Triton's
    error from inside the kernel. The path is chosen before the launch (checked here without a GPU)."""

    class Rows:
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, (2, kernels.TRITON_MAX_ROW + 1)

        def numel(self):
            return 2 * (kernels.TRITON_MAX_ROW + 1)

    monkeypatch.setattr(kernels, "resolve", lambda mode, device: "fused")
    assert kernels._path("auto", Rows(), Rows.shape[-1]) == "reference"
    assert kernels._path("auto", Rows(), kernels.TRITON_MAX_ROW) == "fused"
    with pytest.raises(ValueError, match=r"exceeds the Triton kernels' one-block rows \(1048576\)"):
        kernels._path("fused", Rows(), Rows.shape[-1])
