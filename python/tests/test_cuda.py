"""The CUDA kernels (run where a GPU is present, skipped elsewhere): the CPU kernels' results, for every
logits dtype; opcheck; gradients; both paths captured in a CUDA graph (no host synchronisation, the current
stream); NaN logits on the Sinkhorn path raise as on the CPU."""
import pytest
import torch

import ssr_torch
from conftest import make_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not torch._C._dispatch_has_kernel_for_dispatch_key(
    "ssr::route", "CUDA"), reason="needs a GPU and the operators' CUDA kernels")


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5),
                                              (torch.bfloat16, 1e-5), (torch.float16, 1e-5)])
@pytest.mark.parametrize("policy", ["softmax", "sinkhorn"])
def test_cuda_routes_as_the_cpu(policy, dtype, tolerance):
    s = make_logits(3000, 16, 1).to(dtype)
    host = s.float() if dtype in (torch.bfloat16, torch.float16) else s  # the CPU reads them as float
    e_gpu, w_gpu, load_gpu, info_gpu = ssr_torch.route(s.cuda(), policy, 2, noise_alpha=0.3, step=2)
    e_cpu, w_cpu, load_cpu, info_cpu = ssr_torch.route(host, policy, 2, noise_alpha=0.3, step=2)
    same = (e_gpu.cpu() == e_cpu).all(dim=1)
    assert same.float().mean() > 0.999  # all but near-ties
    torch.testing.assert_close(w_gpu.cpu()[same], w_cpu[same], rtol=0, atol=tolerance * 10)
    assert info_gpu.device.type == "cuda" and info_gpu[0].item() == info_cpu[0].item()
    assert load_gpu.sum().item() == 3000 * 2


@pytest.mark.parametrize("policy", ["softmax", "sinkhorn"])
def test_cuda_opcheck(policy):
    s = make_logits(64, 8, 6, dtype=torch.float32).cuda().requires_grad_()
    torch.library.opcheck(torch.ops.ssr.route.default, (s, policy, 2, "linear", 0.5, 1e-4, 100, "scores", 0.5),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_cuda_selection_routes_as_the_cpu(dtype):
    s = make_logits(3000, 64, 7).to(dtype)
    host = s.float() if dtype == torch.bfloat16 else s
    bias = 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(1))
    options = dict(score="sigmoid", n_groups=8, topk_groups=4, training=True)
    e_gpu, w_gpu, load_gpu, _ = ssr_torch.route(s.cuda(), "softmax", 6, expert_bias=bias.cuda(), **options)
    e_cpu, w_cpu, load_cpu, _ = ssr_torch.route(host, "softmax", 6, expert_bias=bias, **options)
    same = (e_gpu.cpu() == e_cpu).all(dim=1)
    assert same.float().mean() > 0.999  # all but near-ties
    torch.testing.assert_close(w_gpu.cpu()[same], w_cpu[same], rtol=0, atol=1e-6)
    x = [host.clone().requires_grad_(), s.cuda().requires_grad_()]
    for t, b in zip(x, (bias, bias.cuda())):
        w = ssr_torch.route(t, "softmax", 6, expert_bias=b, **options)[1]
        (w * torch.arange(6, dtype=w.dtype, device=w.device)).sum().backward()
    # The gradient comes in the logits' dtype: for bfloat16, the CPU's float gradient rounded to bfloat16,
    # within one unit in its last place (the two float gradients may straddle a rounding boundary).
    expected = x[0].grad.to(dtype).to(x[0].grad.dtype)
    rtol = 2.0 ** -7 if dtype == torch.bfloat16 else 0
    torch.testing.assert_close(x[1].grad.cpu().to(x[0].grad.dtype)[same], expected[same], rtol=rtol, atol=1e-5)


def test_cuda_gradients_match_the_cpu():
    s = make_logits(200, 8, 3)
    grads = []
    for device in ("cpu", "cuda"):
        x = s.detach().to(device).requires_grad_()  # a leaf on each device (s.to("cpu") would be s itself)
        _, w, _, _ = ssr_torch.route(x, "sinkhorn", 2, weights="scores")
        (w * torch.arange(400, dtype=w.dtype, device=device).reshape(200, 2)).sum().backward()
        grads.append(x.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-10)
    x = s.cuda().requires_grad_()
    ssr_torch.route(x, "sinkhorn", 2, weights="plan")[1].sum().backward()
    assert torch.count_nonzero(x.grad) == 0  # plan weights pass no gradient, read on the device


def test_softmax_path_is_captured_in_a_cuda_graph():
    # A capture fails on any host synchronisation and runs on a side stream: the softmax path neither
    # waits for the host nor leaves the current stream.
    s = make_logits(4096, 16, 4, dtype=torch.float32).cuda()
    ssr_torch.route(s, "softmax", 2)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        experts, weights, load, info = ssr_torch.route(s, "softmax", 2)
    s.copy_(make_logits(4096, 16, 5, dtype=torch.float32).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(experts.cpu(), ssr_torch.route(s.cpu(), "softmax", 2)[0])


def test_nan_logits_on_the_sinkhorn_path_raise_as_on_the_cpu():
    bad = make_logits(3000, 16, 7, dtype=torch.float32)
    bad[1234, 5] = float("nan")
    for device in ("cpu", "cuda"):
        with pytest.raises(RuntimeError, match=r"logits\(1234, 5\) = nan"):
            ssr_torch.route(bad.to(device), "sinkhorn", 2)
    experts = ssr_torch.route(bad.cuda(), "softmax", 2)[0]  # the softmax path never waits: NaN ranks as -inf
    assert 5 not in experts[1234].tolist()


def test_sinkhorn_path_is_captured_in_a_cuda_graph():
    # A fixed 20 iterations (a tolerance it cannot reach), so the replay's statistics are known.
    options = dict(k=2, tol=1e-300, max_iters=20)
    s = make_logits(4096, 16, 4, dtype=torch.float32).cuda()
    ssr_torch.route(s, "sinkhorn", **options)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        experts, weights, load, info = ssr_torch.route(s, "sinkhorn", **options)
    fresh = make_logits(4096, 16, 5, dtype=torch.float32)
    s.copy_(fresh.cuda())
    graph.replay()
    torch.cuda.synchronize()
    e_cpu, w_cpu, _, info_cpu = ssr_torch.route(fresh, "sinkhorn", **options)
    same = (experts.cpu() == e_cpu).all(dim=1)
    assert same.float().mean() > 0.999
    torch.testing.assert_close(weights.cpu()[same], w_cpu[same], rtol=0, atol=1e-4)
    assert info[0].item() == 1 and info[2].item() == 20 == info_cpu[2].item()
