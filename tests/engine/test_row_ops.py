"""The torch path's work between products in the kernels' pool (kernels/row_ops.c) against
the same in torch ops: the residual add with RMS norm, rope, SiLU(gate) * up."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels
from inference.engine.layers.rotary import rope_rotation_sin
from inference.engine.row_ops import PoolRowOps, TorchRowOps
from tests.engine.conftest import needs_kernels

lib = kernels.load()
pytestmark = needs_kernels

# float32 both ways; sums in another order, so within a few ulps of the values' size.
TOL = {"atol": 2e-5, "rtol": 2e-5}


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def ops(request: pytest.FixtureRequest) -> tuple[TorchRowOps, PoolRowOps]:
    kernels.set_threads(request.param)
    yield TorchRowOps(1e-5), PoolRowOps(lib, 1e-5)
    kernels.set_threads(None)


# Row counts around the pool's chunks of 8, widths with and without a vector tail.
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 70])
@pytest.mark.parametrize("n", [576, 60])
def test_add_norm_adds_in_place_and_normalizes(ops, rows, n):
    torch_ops, pool_ops = ops
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g) * 3
    delta, w = torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    want_x, want_h = torch_ops.add_norm(x.clone(), delta, w)
    got_in = x.clone()
    got_x, got_h = pool_ops.add_norm(got_in, delta, w)
    assert got_x.data_ptr() == got_in.data_ptr()  # the residual stream is updated in place
    torch.testing.assert_close(got_x, want_x, **TOL)
    torch.testing.assert_close(got_h, want_h, **TOL)
    # No delta: the norm alone, x untouched.
    got_x, got_h = pool_ops.add_norm(x.clone(), None, w)
    torch.testing.assert_close(got_x, x, rtol=0, atol=0)
    torch.testing.assert_close(got_h, torch_ops.add_norm(x, None, w)[1], **TOL)


# head_dim 64 and 48 take whole vectors (half a multiple of 8); 40 the scalar form.
@pytest.mark.parametrize("rows", [1, 9, 33])
@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(9, 3, 64), (4, 2, 48), (2, 1, 40)])
def test_rope_rotates_q_and_k_only(ops, rows, heads, kv_heads, d):
    torch_ops, pool_ops = ops
    g = torch.Generator().manual_seed(rows + d)
    qkv = torch.randn(rows, heads + 2 * kv_heads, d, generator=g)
    angles = torch.rand(rows, d // 2, generator=g) * 100
    cos = torch.cat([angles.cos()] * 2, dim=-1)
    sin = rope_rotation_sin(torch.cat([angles.sin()] * 2, dim=-1))
    want, got = qkv.clone(), qkv.clone()
    torch_ops.rope(want, heads + kv_heads, cos, sin)
    pool_ops.rope(got, heads + kv_heads, cos, sin)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(
        got[:, heads + kv_heads :], qkv[:, heads + kv_heads :], rtol=0, atol=0
    )


def test_rope_refuses_a_strided_qkv(ops):
    _, pool_ops = ops
    qkv = torch.randn(4, 10, 64)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        pool_ops.rope(qkv, 3, torch.ones(4, 64), torch.zeros(4, 64))


@pytest.mark.parametrize("rows", [1, 8, 17])
@pytest.mark.parametrize("n", [1536, 36])
def test_silu_times_up_over_a_wide_range(ops, rows, n):
    torch_ops, pool_ops = ops
    g = torch.Generator().manual_seed(rows + n)
    gate_up = torch.randn(rows, 2 * n, generator=g) * 10
    gate_up[0, :4] = torch.tensor([-120.0, 95.0, 0.0, -0.0])  # exp's clamps and zero
    torch.testing.assert_close(pool_ops.act(gate_up), torch_ops.act(gate_up), **TOL)


def test_the_eager_forward_takes_the_pool_ops_for_a_float32_cpu_model(make_engine):
    model = make_engine().runner.model
    assert isinstance(model.pool_ops, PoolRowOps)
