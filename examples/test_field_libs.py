"""A small pytest file over public CuTe DSL libraries, checked against torch.

    python -m pytest -q examples/test_field_libs.py
    cutedebug exec -- python -m pytest -q examples/test_field_libs.py   # watched, instrumented
    cutedebug mutate -- python -m pytest -q examples/test_field_libs.py # do these checks notice
                                                                        # injected pipeline faults?

Each test calls one public entry point (quack-kernels 0.6.5, flash-attn-4 4.0.0b36:
`pip install 'cutedebug[field]'`) on the sizes of the field scenarios and compares with the
same math in fp32 torch. Without a CUDA GPU or without the libraries, each test is skipped
with the reason.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def _randn(gen, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=gen, device="cuda").to(dtype)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(0)


def assert_close(out, ref, atol, rtol):
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_rmsnorm_forward_2cta_cluster(gen):
    quack = pytest.importorskip("quack")
    x, w = _randn(gen, 2048, 32768), (1 + 0.1 * _randn(gen, 32768, dtype=torch.float32))
    w = w.to(torch.bfloat16)
    y = quack.rmsnorm(x, w, eps=1e-6)
    ref = torch.nn.functional.rms_norm(x.float(), (32768,), w.float(), eps=1e-6)
    assert_close(y, ref, 2e-2, 1e-2)


def test_rmsnorm_backward_4cta_cluster(gen):
    quack = pytest.importorskip("quack")
    rows, n = 2048, 32768
    x = _randn(gen, rows, n).requires_grad_()
    w = (1 + 0.1 * _randn(gen, n, dtype=torch.float32)).to(torch.bfloat16).requires_grad_()
    dy = _randn(gen, rows, n)
    quack.rmsnorm(x, w, eps=1e-6).backward(dy)
    xf, wf = (t.detach().float().requires_grad_() for t in (x, w))
    torch.nn.functional.rms_norm(xf, (n,), wf, eps=1e-6).backward(dy.float())
    assert_close(x.grad, xf.grad, 5e-2, 2e-2)
    assert_close(w.grad / rows, wf.grad / rows, 5e-2, 2e-2)


def test_gemm_bf16(gen):
    gemm_interface = pytest.importorskip("quack.gemm_interface")
    a, b = _randn(gen, 2048, 2048), _randn(gen, 2048, 2048)
    d = gemm_interface.gemm(a, b, tuned=False)
    assert_close(d, a.float() @ b.float(), 1.0, 2e-2)  # entries ~ N(0, 2048), bf16 output


def test_flash_attention_forward(gen):
    fa = pytest.importorskip("flash_attn.cute")
    q, k, v = (_randn(gen, 2, 1024, 8, 128) for _ in range(3))
    out = fa.flash_attn_func(q, k, v, causal=False)
    out = out[0] if isinstance(out, tuple) else out
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    ref = (((qf @ kf.transpose(-1, -2)) / math.sqrt(128)).softmax(-1) @ vf).transpose(1, 2)
    assert_close(out, ref, 2e-2, 2e-2)
