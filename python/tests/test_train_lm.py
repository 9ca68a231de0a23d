"""The language-model recipe (python/examples/train_lm.py): every router trains through ssr_torch.Router with
finite losses, runs are reproducible and start alike, SSR-L trains at xi = 0.05, and its statistics are right."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import train_lm  # noqa: E402
from byte_text import random_windows  # noqa: E402

TINY = ["--layers", "1", "--hidden", "16", "--inner", "16", "--heads", "2", "--experts", "8", "--seq", "16",
        "--batch", "4", "--eval-tokens", "256", "--threads", "1"]


def recipe(tmp_path, *options, timeout=240):
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_lm.py"), *TINY, *options, "--json", str(out)],
                            capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    def not_json(constant):
        raise AssertionError(f"{constant} is not JSON")
    return result.stdout, json.loads(out.read_text(), parse_constant=not_json)


def test_t_quantiles_are_students():
    # Two-sided 95% quantiles from published tables.
    for df, value in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (29, 2.0452)):
        assert train_lm.t_quantile(df) == pytest.approx(value, abs=1e-4)
    centre, low, high = train_lm.paired([3.0, 5.0, 7.0], [2.0, 3.0, 4.0])  # differences 1, 2, 3: sd 1
    assert centre == 2.0 and high - centre == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)


def test_every_router_trains_with_finite_losses_and_paired_differences(tmp_path):
    stdout, out = recipe(tmp_path, "--routers", "all", "--steps", "4", "--seeds", "2", "--p", "1")
    names = list(train_lm.ROUTERS)
    assert list(out["results"]) == names
    for name, runs in out["results"].items():
        assert len(runs) == 2
        for run in runs:
            assert all(math.isfinite(run[key]) for key in ("train", "valid", "attacked", "load", "train_load"))
            assert len(run["curve"]) == 4
            sinkhorn = name == "sinkhorn" or name.startswith("ssr")  # p = 1: every training call
            assert run["sinkhorn"] == (4 if sinkhorn else 0), name
    for reference in ("softmax", "softmax+lb"):
        assert set(out["paired"][reference]) == set(names) - {reference}
        for name, metrics in out["paired"][reference].items():  # from the runs' own values, seed by seed
            for key, d in metrics.items():
                runs, base = out["results"][name], out["results"][reference]
                assert d["mean"] == pytest.approx(sum(a[key] - b[key] for a, b in zip(runs, base)) / 2, abs=1e-12)
    assert "Δ val bits/byte vs softmax+lb" in stdout


def test_bfloat16_matrix_products_train_every_kind_of_router(tmp_path):
    # The CUDA default, run here through the CPU's autocast: the routers still see float32 logits.
    _, out = recipe(tmp_path, "--routers", "softmax+lb,noisy-gating,ssr-l,sigmoid+bias", "--steps", "3", "--p", "1",
                    "--precision", "bf16")
    assert out["setup"]["precision"] == "bf16"
    for runs in out["results"].values():
        assert all(math.isfinite(runs[0][key]) for key in ("train", "valid", "attacked"))


def test_ssr_l_trains_at_small_xi_and_its_loss_falls(tmp_path):
    # The paper's linear-cost Sinkhorn overflows to NaN at xi = 0.05; the log-domain solve does not.
    _, out = recipe(tmp_path, "--routers", "ssr-l,ssr-s", "--xi", "0.05", "--p", "1", "--steps", "40", "--lr",
                    "1e-2")
    assert out["setup"]["xi"] == 0.05
    for name, (run,) in out["results"].items():
        losses = [loss for _, loss, _ in run["curve"]]
        assert all(math.isfinite(v) for v in losses) and run["sinkhorn"] == 40
        assert losses[-1] < losses[0] - 1.0, (name, losses)


def test_routers_see_the_same_batches_and_dropout_masks(tmp_path):
    # SSR with p = 0 routes as softmax top-k: with dropout on, every result equals softmax's bit for bit.
    _, out = recipe(tmp_path, "--routers", "softmax,ssr-l,ssr-s", "--steps", "6", "--p", "0", "--dropout", "0.1",
                    "--seeds", "2")
    for name in ("ssr-l", "ssr-s"):
        for run, reference in zip(out["results"][name], out["results"]["softmax"]):
            assert {k: v for k, v in run.items() if k != "ms"} == {k: v for k, v in reference.items() if k != "ms"}


def test_runs_are_reproducible_and_every_router_starts_from_the_same_weights():
    args = train_lm.parse_args(TINY + ["--steps", "3", "--seeds", "1"])
    train, valid = train_lm.split_bytes(None, args.valid)
    attacked = train_lm.attacked(valid, args.attack)

    def run(seed):
        result = train_lm.run("ssr-l-noise", seed, args, train, valid, attacked)
        del result["ms"]  # all but the time
        return result

    first = run(5)
    assert run(5) == first  # bit for bit
    assert run(6) != first
    models = []
    for name in ("softmax", "noisy-gating", "sigmoid+bias"):
        torch.manual_seed(5)
        models.append(train_lm.ByteLM(args, name, 5).state_dict())
    for other in models[1:]:
        for key, value in models[0].items():
            assert torch.equal(other[key], value), key


def test_no_seed_draws_another_seeds_batches_as_its_noise():
    draws = {}
    for seed in range(3):
        batches, noise = train_lm.generators(seed, "cpu")
        draws[seed] = [torch.randn(64, generator=batches), torch.randn(64, generator=noise)]
    streams = [d for pair in draws.values() for d in pair]
    for i, first in enumerate(streams):
        for second in streams[i + 1:]:
            assert not torch.equal(first, second)
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--seed", str(2**31 - 1), "--seeds", "2"])


def test_without_an_attack_the_attacked_metric_is_null(tmp_path):
    stdout, out = recipe(tmp_path, "--routers", "softmax,ssr-s", "--steps", "2", "--seeds", "2", "--attack", "0")
    assert all(run["attacked"] is None for runs in out["results"].values() for run in runs)
    assert out["paired"]["softmax"]["ssr-s"]["attacked"] is None
    assert out["paired"]["softmax"]["ssr-s"]["valid"]["mean"] is not None
    assert "nan" not in stdout


@pytest.mark.parametrize("options, message", [
    (["--routers", "softmax,ssr-l,softmax"], "names a router twice"),
    (["--routers", "softmax,ssr-l", "--p", "2"], "router ssr-l: .*p"),
    (["--routers", "softmax,ssr-s", "--xi", "0"], "router ssr-s: .*xi"),
    (["--routers", "softmax,grouped+bias", "--experts", "6"], "router grouped\\+bias"),
    (["--routers", "softmax", "--clip", "nan"], "--clip must be a finite number"),
    (["--routers", "softmax", "--lr", "inf"], "--lr must be a finite number"),
])
def test_every_router_is_checked_before_the_first_one_trains(options, message, capsys):
    with pytest.raises(SystemExit):
        train_lm.parse_args(TINY + options)
    assert re.search(message, capsys.readouterr().err)


def test_a_text_file_is_split_ninety_ten(tmp_path):
    data = tmp_path / "text.txt"
    data.write_bytes(bytes(range(32, 127)) * 200)
    stdout, out = recipe(tmp_path, "--routers", "softmax", "--steps", "2", "--data", str(data))
    assert "text.txt (17100 train / 1900 validation bytes)" in stdout


def test_a_text_too_short_for_a_validation_window_is_named(tmp_path):
    data = tmp_path / "short.txt"
    data.write_bytes(b"x" * 160)  # 16 validation bytes: no window of 16 bytes and the next
    with pytest.raises(SystemExit, match="too short for sequences of 16 bytes: 144 train and 16 validation"):
        train_lm.main([*TINY, "--data", str(data)])


def test_training_windows_start_anywhere_they_fit_and_read_the_last_byte():
    data = torch.arange(10)
    gen = torch.Generator().manual_seed(0)
    windows = random_windows(data, 4, 2000, gen)
    assert windows.shape == (2000, 4)
    assert torch.equal(windows - windows[:, :1], torch.arange(4).expand(2000, 4))  # consecutive bytes
    assert set(windows[:, 0].tolist()) == set(range(7))  # every start that fits, the one ending the text included
    assert torch.equal(random_windows(data, 10, 3, gen), data.expand(3, 10))  # a text exactly one window long
    with pytest.raises(ValueError, match="at least 11 bytes"):
        random_windows(data, 11, 1, gen)


@pytest.mark.parametrize("bad, message", [(["--routers", "nope"], "unknown router 'nope'"),
                                          (["--hidden", "15"], "multiple of"), (["--k", "0"], "--k"),
                                          (["--valid", "0.5"], "--valid"), (["--data", "missing"], "no such file"),
                                          (["--eval-tokens", "10"], "--eval-tokens")])
def test_bad_options_are_named(bad, message, capsys):
    with pytest.raises(SystemExit) as exit:
        train_lm.parse_args(bad)
    assert exit.value.code == 2 and message in capsys.readouterr().err
