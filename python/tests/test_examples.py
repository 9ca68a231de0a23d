"""The package's examples run as a user runs them, and show what they claim."""
import os
import subprocess
import sys
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_moe_layer_example_resumes_a_checkpoint_bit_for_bit(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "moe_layer.py"), "--steps", "40", "--checkpoint",
                             str(tmp_path / "moe.pt")],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the same losses, bit for bit" in result.stdout
    assert "0 of them on the Sinkhorn path" not in result.stdout


def test_the_readme_moe_snippet_routes_and_trains():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class MoE" in snippet
    scope = {}
    exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102  the README's own code
    torch.manual_seed(0)
    layer = scope["MoE"](d=16, n_experts=4, layer=0)
    x = torch.randn(64, 16)
    out = layer(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().mean().backward()
    assert layer.gate.weight.grad is not None and layer.gate.weight.grad.abs().sum() > 0  # a softmax step
    assert layer.router.step == 1


def test_the_router_replay_how_to_runs():
    page = (Path(__file__).resolve().parents[2] / "docs" / "howto-replay.md").read_text()
    snippet = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert "replays.replay()" in snippet
    exec(compile(snippet, "howto-replay.md", "exec"), {})  # noqa: S102  the page's own code, which asserts
