"""ssr_torch.hf.replace_routers on tiny transformers MoE models built from configs (random weights): every
block routes through its Router, eval mode reproduces the model's own softmax top-k routing, gradients
reach the gate, router_logits and the aux loss still work, unsupported models fail clearly, and the
tiny-shakespeare example runs."""
import copy
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import ssr_torch  # noqa: E402
from ssr_torch.hf import SsrGate, replace_routers, restore_routers  # noqa: E402

PYTHON_DIR = Path(__file__).resolve().parents[1]

N_EXPERTS, K, HIDDEN, LAYERS = 8, 2, 32, 2


def tiny_model(arch="qwen3_moe", norm_topk_prob=True):
    common = dict(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32, num_experts_per_tok=K,
                  experts_implementation="eager")
    if arch == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, head_dim=8, num_experts=N_EXPERTS, moe_intermediate_size=16,
                                             intermediate_size=64, norm_topk_prob=norm_topk_prob)
    elif arch == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(**common, num_experts=N_EXPERTS, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=32, intermediate_size=64,
                                             norm_topk_prob=norm_topk_prob)
    elif arch == "mixtral":
        config = transformers.MixtralConfig(**common, head_dim=8, num_local_experts=N_EXPERTS, intermediate_size=16)
    else:
        config = transformers.OlmoeConfig(**common, num_experts=N_EXPERTS, intermediate_size=16,
                                          norm_topk_prob=norm_topk_prob)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # gates initialised near zero would leave near-ties in the top-k
        for block in moe_blocks(model):
            block.gate.weight.normal_()
    return model


def moe_blocks(model):
    return [layer.mlp for layer in model.model.layers]


def tokens(batch=2, seq=16):
    return torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(1))


def test_every_block_routes_through_its_router():
    model = tiny_model()
    keys = list(model.state_dict())
    routers = replace_routers(model, "ssr", p=1.0, seed=7)
    assert [r.layer for r in routers] == list(range(LAYERS))
    assert all(isinstance(block.gate, SsrGate) and block.gate.ssr is r for block, r in zip(moe_blocks(model), routers))
    assert list(model.state_dict()) == keys  # same parameters under the same names

    model.train()
    x = tokens()
    model(x)
    for router in routers:
        assert router.step == 1 and router.training
        assert router.info[0].item() == 1.0  # p = 1: this training call took Sinkhorn
        assert router.load.sum().item() == x.numel() * K

    model.eval()
    model(x)
    assert all(r.step == 1 and not r.training for r in routers)  # eval calls do not count

    again = replace_routers(model, "softmax")
    assert all(block.gate.ssr is r for block, r in zip(moe_blocks(model), again))
    assert restore_routers(model) == LAYERS
    assert not any(isinstance(block.gate, SsrGate) or hasattr(block.gate, "ssr") for block in moe_blocks(model))


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"])
def test_eval_routes_like_the_original_block(arch):
    """In eval (and with the softmax router in training) the block chooses the softmax top-k of its gate
    logits and gives the original block's output, the model's top-k weights being normalised."""
    model = tiny_model(arch)
    x = tokens()
    hidden = torch.randn(2, 16, HIDDEN, generator=torch.Generator().manual_seed(2))
    model.eval()
    with torch.no_grad():
        reference_logits = model(x).logits
        reference_blocks = [block(hidden) for block in moe_blocks(model)]
        gate_logits = [torch.nn.functional.linear(hidden.reshape(-1, HIDDEN), b.gate.weight) for b in moe_blocks(model)]
    routers = replace_routers(model, "ssr", p=1.0)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, reference_logits)
        for block, router, reference, logits in zip(moe_blocks(model), routers, reference_blocks, gate_logits):
            torch.testing.assert_close(block(hidden), reference)
            chosen = torch.bincount(logits.topk(K, dim=1).indices.reshape(-1), minlength=N_EXPERTS)
            assert torch.equal(router.load.long(), chosen)

    replace_routers(model, "softmax")
    model.train()
    with torch.no_grad():
        for block, reference in zip(moe_blocks(model), reference_blocks):
            torch.testing.assert_close(block(hidden), reference)


def test_unnormalised_model_compares_with_normalised_top_k():
    """With norm_topk_prob=False the model weights its experts by the raw softmax; the Router's weights are
    those renormalised over the chosen experts, which is what the block gives in eval."""
    model = tiny_model("qwen3_moe", norm_topk_prob=False)
    block = moe_blocks(model)[0]
    hidden = torch.randn(32, HIDDEN, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        probs = torch.softmax(torch.nn.functional.linear(hidden, block.gate.weight), dim=1)
        top, index = probs.topk(K, dim=1)
        expected = block.experts(hidden, index, top / top.sum(1, keepdim=True))
        with pytest.warns(UserWarning, match="norm_topk_prob=False"):
            replace_routers(model)
        model.eval()
        torch.testing.assert_close(block(hidden[None]).squeeze(0), expected)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_the_weights_keep_the_gates_dtype_in_bfloat16(arch):
    # Mixtral's gate returns float32 weights for bfloat16 logits, Qwen3-MoE's bfloat16 ones.
    model = tiny_model(arch).to(torch.bfloat16).eval()
    gate = moe_blocks(model)[0].gate
    hidden = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        _, reference, reference_experts = gate(hidden)
        replace_routers(model)
        model.eval()
        logits, weights, experts = gate(hidden)
    assert logits.dtype == torch.bfloat16 and weights.dtype == reference.dtype
    assert torch.equal(experts, reference_experts)
    torch.testing.assert_close(weights, reference)


def test_router_logits_and_aux_loss_still_work():
    model = tiny_model()
    replace_routers(model, "ssr", p=1.0)
    model.train()
    x = tokens()
    out = model(x, labels=x, output_router_logits=True)
    assert len(out.router_logits) == LAYERS
    for block, logits in zip(moe_blocks(model), out.router_logits):
        assert logits.shape == (x.numel(), N_EXPERTS)
        assert logits.grad_fn is not None  # the gate's own logits, differentiable
    assert torch.isfinite(out.aux_loss) and out.aux_loss.item() > 0
    plain = model(x, labels=x, output_router_logits=False)
    assert plain.aux_loss is None and torch.isfinite(plain.loss)


@pytest.mark.parametrize("weights", ["scores", "plan"])
def test_training_reaches_the_gate_with_score_weights(weights):
    """Sinkhorn on every call: score weights carry the softmax gradient to the gate, plan weights none
    (the paper's stop-gradient), so the gate's gradient shows which routing the block used."""
    model = tiny_model()
    routers = replace_routers(model, "sinkhorn", weights=weights)
    model.train()
    x = tokens()
    model(x, labels=x).loss.backward()
    for block in moe_blocks(model):
        grad = block.gate.weight.grad
        assert (grad is not None and grad.abs().sum() > 0) == (weights == "scores")
    assert all(r.info[0].item() == 1.0 for r in routers)


def test_a_few_training_steps_with_ssr():
    model = tiny_model()
    routers = replace_routers(model, "ssr", p=0.5, weights="scores")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = tokens(4, 16)
    losses = []
    for _ in range(8):
        loss = model(x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        assert all(b.gate.weight.grad.abs().sum() > 0 for b in moe_blocks(model))
        optimizer.step()
        losses.append(loss.item())
    assert all(r.step == 8 for r in routers)
    assert losses[-1] < losses[0]


def test_persistent_routers_resume_their_steps_from_the_state_dict():
    model = tiny_model()
    keys = list(model.state_dict())
    replace_routers(model, "ssr", p=0.5, seed=3, persistent=True)
    model.train()
    for _ in range(3):
        model(tokens())
    state = model.state_dict()
    saved = [key for key in state if key not in keys]
    assert saved == [f"model.layers.{i}.mlp.gate.ssr._extra_state" for i in range(LAYERS)]
    assert [state[key].tolist() for key in saved] == [[3, i, 3] for i in range(LAYERS)]
    resumed = tiny_model()
    routers = replace_routers(resumed, "ssr", p=0.5, seed=3, persistent=True)
    resumed.load_state_dict(state)
    assert [r.step for r in routers] == [3] * LAYERS
    with pytest.raises(RuntimeError, match="Unexpected key"):
        tiny_model().load_state_dict(state)
    tiny_model().load_state_dict(state, strict=False)


def test_gradient_checkpointing_recomputes_the_same_routing():
    """The forward that backward runs again routes with the step it recomputes: same gradients as without
    checkpointing, and one step counted."""
    x = tokens(4, 16)
    grads, loads = [], []
    for checkpointing in (False, True):
        model = tiny_model()
        routers = replace_routers(model, "ssr", p=0.5, weights="scores", seed=3)
        model.train()
        if checkpointing:
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        for _ in range(3):  # steps 0, 1, 2: the coin differs between neighbouring steps of some layer
            model.zero_grad()
            model(x, labels=x).loss.backward()
        assert all(r.step == 3 for r in routers)
        grads.append([p.grad.clone() for p in model.parameters()])
        loads.append([r.load.clone() for r in routers])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert all(torch.equal(a, b) for a, b in zip(*loads))


def test_a_replaced_model_pickles_and_copies():
    model = tiny_model("mixtral")
    replace_routers(model, "ssr", p=0.5)
    model.eval()
    x = tokens()
    with torch.no_grad():
        expected = model(x).logits
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        assert all(isinstance(b.gate, SsrGate) for b in moe_blocks(other))
        with torch.no_grad():
            torch.testing.assert_close(other(x).logits, expected)


class _OldStyleBlock(torch.nn.Module):
    """The transformers 4.x layout: a Linear gate and a list of expert MLPs, routed inside the block."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 4, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))


def test_a_router_with_a_bias_lies_on_its_gate_s_device():
    model = tiny_model().to("meta")
    routers = replace_routers(model, router="softmax", score="sigmoid", n_experts=N_EXPERTS, expert_bias=True)
    assert all(r.expert_bias.device.type == "meta" for r in routers)


def test_unsupported_models_fail_clearly():
    model = torch.nn.Sequential(_OldStyleBlock())
    with pytest.raises(TypeError, match=r"unsupported MoE block _OldStyleBlock \(gate Linear\)"):
        replace_routers(model)
    assert type(model[0].gate) is torch.nn.Linear  # nothing changed

    dense = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(TypeError, match="LlamaForCausalLM has no MoE block"):
        replace_routers(dense)

    moe = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(
        vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, num_local_experts=4, num_experts_per_tok=2))
    with pytest.raises(TypeError, match=r"unsupported MoE block GptOssMLP \(router GptOssTopKRouter\)"):
        replace_routers(moe)

    model = tiny_model()
    with pytest.raises(TypeError, match="layer is set per block"):
        replace_routers(model, layer=3)
    with pytest.raises(ValueError, match="invalid p"):
        replace_routers(model, p=2.0)
    assert not any(isinstance(block.gate, SsrGate) for block in moe_blocks(model))


def test_the_example_runs_and_its_loss_falls(tmp_path):
    data = tmp_path / "text.txt"
    data.write_bytes(Path(PYTHON_DIR / "ssr_torch" / "router.py").read_bytes() * 8)
    example = PYTHON_DIR / "examples" / "hf_moe_tinyshakespeare.py"
    result = subprocess.run([sys.executable, str(example), "--steps", "20", "--routers", "original,ssr",
                             "--batch", "8", "--seq", "32", "--hidden", "32", "--val-batches", "1", "--data",
                             str(data), "--p", "0.2"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].split()[0]: line for line in result.stdout.splitlines()
            if line.startswith("| original") or line.startswith("| ssr")}
    assert set(rows) == {"original", "ssr"}
    for line in rows.values():
        first, last = map(float, re.search(r"(\d+\.\d+) -> (\d+\.\d+)", line).groups())
        assert last < first - 1.0
    calls = int(re.search(r"(\d+) / 40 \|", rows["ssr"]).group(1))
    assert 0 < calls < 40  # p = 0.2 over 2 layers x 20 steps


def test_the_example_runs_on_its_generated_text_from_anywhere(tmp_path):
    example = PYTHON_DIR / "examples" / "hf_moe_tinyshakespeare.py"
    result = subprocess.run([sys.executable, str(example), "--steps", "10", "--routers", "ssr", "--batch", "4",
                             "--seq", "32", "--hidden", "32", "--val-batches", "1"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert result.returncode == 0, result.stderr
    assert "from a generated text" in result.stdout
    assert re.search(r"^\| ssr \(p 0\.05\) +\| +\d+\.\d+ -> \d+\.\d+ \|", result.stdout, re.M), result.stdout


def test_router_replay_replays_a_rollout_bit_for_bit():
    """Recorded in evaluation (a rollout), replayed in training: the same experts and logits, bit for bit, where
    SSR would route by its plan; the gradient reaches every gate."""
    model = tiny_model()
    routers = replace_routers(model, "ssr", p=1.0, seed=3)
    replays = ssr_torch.attach_replay(model, tokens=2 * 16)
    assert len(replays) == len(routers)
    x = tokens(2, 16)
    model.eval()
    replays.record()
    with torch.no_grad():
        rollout = model(x).logits
    loads = [r.load.clone() for r in routers]
    model.train()
    replays.replay()
    out = model(x, labels=x)
    assert torch.equal(out.logits, rollout)
    assert all(torch.equal(r.load, load) for r, load in zip(routers, loads))
    out.loss.backward()
    assert all(torch.count_nonzero(block.gate.weight.grad) > 0 for block in moe_blocks(model))
