"""The contract every registered method keeps (ottvid_cli/compression/methods/registry.py, docs/methods.md).

Parametrised over methods.names(), so a newly registered method is covered by adding it to the
registry. `none` only accepts ratio 1: it is checked at ratio 1 only.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ottvid_cli.compression import methods

NAMES = methods.names()
# registered methods run with options, checked like a method of their own: fastvid's LLaVA-OneVision and
# LLaVA-Video paths
VARIANTS = {"fastvid-ov": ("fastvid", {"path": "llava_onevision", "tau": 0.9}),
            "fastvid-llava-video": ("fastvid", {"path": "llava_video", "tau": 0.9})}
CASES = NAMES + list(VARIANTS)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def official_or_skip(name: str):
    """The official implementation of `name` run from its fetched checkout (benchmarks/methods.py), or skip."""
    from benchmarks import methods as bench_methods

    run = bench_methods.official(name)
    if run is None:
        pytest.skip(f"the official {name} checkout is not available")
    return run


def ratio_for(name: str, ratio: float) -> float:
    return 1.0 if name == "none" else ratio


def run(case: str, x, s, grid, ratio: float, **options):
    """compress_with for a registered name or a VARIANTS entry (its options under the given ones)."""
    name, variant = VARIANTS.get(case, (case, {}))
    return methods.compress_with(name, x, s, grid, ratio=ratio, **{**variant, **options})


def tokens(t: int, h: int, w: int, d: int, seed: int, dtype=torch.float32, drift: float = 0.5):
    """A scene plus per-frame noise, non-negative saliency."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, h * w, d, generator=g)
    x = (base + drift * torch.randn(t, h * w, d, generator=g)).to(dtype)
    s = torch.rand(t, h * w, generator=g)
    return x, s, (h, w)


def expected_count(name: str, ratio: float, t: int, n: int) -> int:
    """max(1, round(ratio T N)), for every method (ottvid included: token_counts keeps ceil(M/T) <= K <= M)."""
    return methods.target_count(ratio, t, n)


def check_contract(out, features, ratio, exact=True, name=None):
    """Count, index, assignment, dtype and finiteness of one output."""
    t, n, d = features.shape
    m = out.features.shape[0]
    if exact:
        assert m == expected_count(name, ratio, t, n)
    assert out.features.shape == (m, d) and out.features.dtype == features.dtype
    assert out.index.shape == (m,) and out.index.dtype == torch.long
    assert torch.all(out.index[1:] > out.index[:-1])  # ascending, unique
    assert int(out.index.min()) >= 0 and int(out.index.max()) < t * n
    assert out.assignment.shape == (t * n,)
    assert torch.equal(out.assignment[out.index], torch.arange(m))  # each root represents itself
    assert int(out.assignment.min()) >= -1 and int(out.assignment.max()) < m
    assert bool(torch.isfinite(out.features.float()).all())
    report = out.report.to_dict()
    assert report["kept"] == m


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.integers(1, 5), h=st.integers(1, 4), w=st.integers(1, 4), d=st.integers(1, 6),
       ratio=st.floats(0.01, 1.0), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_invariants(name, t, h, w, d, ratio, dtype, seed):
    ratio = ratio_for(name, ratio)
    x, s, grid = tokens(t, h, w, d, seed, dtype)
    out = run(name, x, s, grid, ratio)
    check_contract(out, x, ratio, name=name)
    again = run(name, x, s, grid, ratio)  # deterministic
    assert torch.equal(out.index, again.index) and torch.equal(out.assignment, again.assignment)
    assert torch.equal(out.features, again.features)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_at_ratio_one(name, dtype):
    x, s, grid = tokens(3, 2, 3, 5, seed=1, dtype=dtype)
    out = run(name, x, s, grid, 1.0)
    assert torch.equal(out.index, torch.arange(18))
    assert torch.equal(out.assignment, torch.arange(18))
    assert torch.equal(out.features, x.reshape(18, 5))


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("case", ["one_frame", "one_token", "identical_frames", "zero_saliency", "constant_tokens"])
def test_degenerate_inputs(name, case):
    t, h, w = {"one_frame": (1, 4, 4), "one_token": (6, 1, 1)}.get(case, (5, 3, 4))
    x, s, grid = tokens(t, h, w, 6, seed=3)
    if case == "identical_frames":
        x = x[:1].expand_as(x).contiguous()
    if case == "zero_saliency":
        s = torch.zeros_like(s)
    if case == "constant_tokens":
        x = torch.ones_like(x)
    for ratio in ([1.0] if name == "none" else [0.05, 0.1, 0.25, 0.5]):
        out = run(name, x, s, grid, ratio)
        check_contract(out, x, ratio, name=name)


@pytest.mark.parametrize("name", CASES)
def test_paper_shape_counts(name):
    """16 x 256 at ratio 0.1 gives 410 tokens (not the 400 or 416 of per-frame rounding)."""
    x, s, grid = tokens(16, 16, 16, 8, seed=5)
    ratio = ratio_for(name, 0.1)
    out = run(name, x, s, grid, ratio)
    check_contract(out, x, ratio, name=name)
    assert out.features.shape[0] == (4096 if name == "none" else 410)


@pytest.mark.parametrize("name", NAMES)
def test_config_is_frozen_and_documented(name):
    method = methods.get(name)
    fields = dataclasses.fields(method.config)
    assert fields[0].name == "ratio"
    config = method.config() if name != "none" else method.config(ratio=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ratio = 0.5
    assert method.config.__doc__ and method.summary


@pytest.mark.parametrize("name", [n for n in NAMES if n != "none"])
@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5, float("nan")])
def test_bad_ratio_is_refused(name, ratio):
    with pytest.raises(ValueError, match="ratio"):
        methods.make_config(name, ratio=ratio)


# ------------------------------------------------------------------------------------------------
# The merge map: `Compressed.apply` (and `mixing`, where a method sets it) gives the features back


def modes(name: str) -> list[dict]:
    """Default; exact=False; bug_compatible=True where the method has them."""
    fields = {f.name for f in dataclasses.fields(methods.get(VARIANTS.get(name, (name,))[0]).config)}
    out = [{}]
    if "exact" in fields:
        out.append({"exact": False})
    if "bug_compatible" in fields:
        out.append({"exact": False, "bug_compatible": True})
    return out


MODES = [(name, options) for name in CASES for options in modes(name)]
MODE_IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options in MODES]
# float32: each mixed row is a weighted sum of at most T*N rows, taken in another order than the method's
RTOL, ATOL = 1e-5, 1e-5


def check_apply(out, x: torch.Tensor, seed: int) -> None:
    """apply(flat input) == features (bit for bit without a mixing: the uniform path), kept-alone rows
    bit-identical, and apply linear on another per-token tensor of another width."""
    t, n, d = x.shape
    flat = x.reshape(t * n, d)
    m = out.features.shape[0]
    got = out.apply(flat)
    assert got.dtype == torch.float32 and got.shape == (m, d)
    if out.mixing is None:
        assert torch.equal(got.to(x.dtype), out.features)
    else:
        assert out.mixing.layout in (torch.sparse_coo, torch.sparse_csr)
        assert out.mixing.shape == (m, t * n) and out.mixing.dtype == torch.float32
        assert out.mixing.device == out.features.device
        if x.dtype == torch.float32:
            torch.testing.assert_close(got, out.features, rtol=RTOL, atol=ATOL)
        else:  # both rounded once to the input dtype from float32
            torch.testing.assert_close(got.to(x.dtype), out.features)
        dense = out.mixing.to_dense()
        alone = (dense != 0).sum(-1) == 1
        alone &= dense[torch.arange(m), out.index] == 1.0
        assert torch.equal(got[alone], flat[out.index[alone]].float())  # a token kept alone: its own row
    g = torch.Generator().manual_seed(seed + 1)
    a, b = torch.randn(t * n, 3, generator=g), torch.randn(t * n, 3, generator=g)
    torch.testing.assert_close(out.apply(0.7 * a - 1.3 * b), 0.7 * out.apply(a) - 1.3 * out.apply(b),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name,options", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.25, 0.5])
def test_apply_reproduces_the_features(name, options, ratio):
    for seed, drift in ((0, 0.1), (1, 0.5)):  # near-static frames merge a lot; drifting ones little
        x, s, grid = tokens(8, 4, 4, 8, seed=seed, drift=drift)
        out = run(name, x, s, grid, ratio_for(name, ratio), **options)
        check_apply(out, x, seed)


@pytest.mark.parametrize("name,options", MODES, ids=MODE_IDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.integers(1, 6), h=st.integers(1, 4), w=st.integers(1, 4), d=st.integers(1, 6),
       ratio=st.floats(0.01, 1.0), dtype=st.sampled_from(DTYPES), drift=st.sampled_from([0.05, 0.5]),
       seed=st.integers(0, 2**16))
def test_apply_reproduces_the_features_on_drawn_shapes(name, options, t, h, w, d, ratio, dtype, drift, seed):
    x, s, grid = tokens(t, h, w, d, seed, dtype, drift=drift)
    out = run(name, x, s, grid, ratio_for(name, ratio), **options)
    check_apply(out, x, seed)


def test_apply_checks_its_rows():
    x, s, grid = tokens(2, 2, 2, 4, seed=0)
    out = methods.compress_with("holitom", x, s, grid, ratio=0.5)
    with pytest.raises(ValueError, match=r"\(8, D'\)"):
        out.apply(torch.zeros(7, 4))


@pytest.mark.parametrize("name", NAMES)
def test_every_method_takes_signals(name):
    """signals= reaches every method; signals equal to the fallbacks (saliency, the mean token) change nothing."""
    x, s, grid = tokens(4, 3, 3, 6, seed=2)
    ratio = ratio_for(name, 0.25)
    base = methods.compress_with(name, x, s, grid, ratio=ratio)
    signals = {"attention": s.clone(), "frame_features": x.float().mean(1), "source": "test"}
    out = methods.compress_with(name, x, s, grid, ratio=ratio, signals=signals)
    assert torch.equal(out.index, base.index) and torch.equal(out.assignment, base.assignment)
    assert torch.equal(out.features, base.features)
