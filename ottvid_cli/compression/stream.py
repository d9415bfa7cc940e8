"""OTT-Vid's stages composed (paper Sec. 3): `compress` on a whole (T, N, D) tensor, and `OTTVidStream`, the
same fed a few temporal groups at a time (`compress` is the stream in one chunk).

The method's structure allows it (paper Sec. 3): the spatial stage (saliency, coverage selection,
leave-one-out mass) works within one group, and the transport cost and alpha_t of pair t read groups t
and t+1 only. So each chunk of groups is reduced, as it arrives, to what the rest of the method needs:
its K selected tokens (features, and any other per-token tensor merged the same way), their masses,
and the cost C_t and alpha_t of every pair it closes (the chunk's first group pairs with the previous
chunk's last, which is carried over). The chunk's other tokens are freed. After the last chunk the
Sinkhorn plans of all pairs are solved in one batch, exactly as `compress` solves them (its tolerance
stop is decided over the whole batch), then the budgets (Eq. 8, over every W_t), the matching, the
union-find and the merge. The decisions and features are those of `compress` on the whole tensor: the
per-chunk arithmetic is the whole tensor's, row for row (tests/test_compress_stream.py).

Memory: one chunk's float32 copy and similarity matrices while it is added; then T K tokens (the
input dtype) and (T-1) K^2 costs for the whole video, never T N.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Sequence

import torch

from ..timing import Stopwatch
from .backend import choose
from .budget import allocate_budget_rounds, uniform_budget
from .config import OTTVidConfig
from .merge import average_components, collapse, match_pairs
from .ottvid import add_total_time, inputs_clean, pair_cap, raise_unless_clean, to_device, token_counts
from .spatial import gram_cosine, inverse_norms, mass_from_similarity, normalize_saliency, select_from_similarity
from .threads import serial
from .transport import grid_positions, mixing_weight, solve_transport, transport_cost
from .types import Compressed, CompressionReport, check_shapes


def compress(
    features: torch.Tensor,
    saliency: torch.Tensor,
    grid: tuple[int, int],
    config: OTTVidConfig | None = None,
    timer: bool | None = None,
    backend: str | None = None,
) -> Compressed:
    """Compress T groups of N = H*W visual tokens to about ratio * T * N tokens with OTT-Vid.

    features: (T, N, D), tokens of each group in row-major grid order; saliency: (T, N) >= 0;
    grid: (H, W). Computes in float32 whatever the input dtype; deterministic.

    timer: whether `report.timings_ms` gets the wall time of each stage. True times every stage,
    which on an accelerator waits for the device at the end of each stage (on CUDA: events, one host
    wait per stage); False never times; None (the default) times only where that costs no device
    synchronisation, i.e. on the CPU, and leaves timings_ms empty on CUDA/MPS. The outputs are the
    same either way.

    backend: "triton" (fused kernels for the greedy selection and Sinkhorn), "torch", or "auto" /
    None (Triton on CUDA when it imports, else PyTorch; see backend.py). The decisions are the same.

    Host round trips (untimed): with the adaptive budget, one transfer of the transport
    difficulties, which also carries the input check; at the end, the report's numbers in one
    transfer. With the uniform budget the input check is its own transfer at the start.

    The same computation as `OTTVidStream` given the whole tensor as one chunk: a long video's groups can
    be compressed as they are encoded, with the same result.
    """
    groups, _ = check_shapes(features, saliency, grid)
    stream = OTTVidStream(groups, grid, config, timer=timer, backend=backend)
    stream.add(features, saliency)
    return stream.finish()


class OTTVidStream:
    """OTT-Vid over `groups` temporal groups of an (H, W) `grid`, added a chunk at a time with `add`;
    `finish` returns the `Compressed` that `compress` returns for the whole (T, N, D) tensor.

    `extra`: other per-token tensors to merge with the same decisions (Qwen3-VL's DeepStack), given
    with each chunk, (t, N, D') each; `finish` puts their merged rows, (M, D') float32 each in `index`
    order, in `Compressed.extra["merged"]` (what `Compressed.apply` gives for the whole tensors).
    `timer` and `backend`: as `compress`'s; stage times add up over the chunks."""

    def __init__(self, groups: int, grid: tuple[int, int], config: OTTVidConfig | None = None,
                 timer: bool | None = None, backend: str | None = None):
        if timer not in (None, True, False):
            raise TypeError(f"timer must be None, True or False, got {timer!r}")
        if isinstance(groups, bool) or int(groups) != groups or groups < 1:
            raise ValueError(f"groups must be a whole number >= 1, got {groups!r}")
        if len(grid) != 2 or min(int(grid[0]), int(grid[1])) < 1:
            raise ValueError(f"grid must be (H, W) with H, W >= 1, got {tuple(grid)}")
        self.config = config or OTTVidConfig()
        self.groups, self.grid = int(groups), (int(grid[0]), int(grid[1]))
        self.tokens = self.grid[0] * self.grid[1]
        self.timer, self.backend = timer, backend
        c = self.config
        self.counts = token_counts(self.groups, self.tokens, c.ratio, c.gamma, c.k_rounding, c.budget_cap)
        self.report = CompressionReport(T=self.groups, N=self.tokens, K=self.counts.K, M=self.counts.M,
                                        r_s=self.counts.r_s, r_t=self.counts.r_t, B_tot=self.counts.B_tot,
                                        config=c.to_dict())
        self.added = 0
        self._device: torch.device | None = None
        self._dtype: torch.dtype | None = None
        self._dim: int | None = None
        self._parts: dict[str, list[torch.Tensor]] = {"selected": [], "mass": [], "alpha": [], "cost": [],
                                                      "kept": []}
        self._extra: list[list[torch.Tensor]] = []
        self._last: tuple[torch.Tensor, ...] | None = None  # the previous chunk's last group, for the pair it opens
        self._clean: torch.Tensor | None = None  # every chunk's input check, when it rides on the budget's transfer

    # ------------------------------------------------------------------------------------------------

    def add(self, features: torch.Tensor, saliency: torch.Tensor, extra: Sequence[torch.Tensor] = ()) -> None:
        """The next `t` groups: features (t, N, D), saliency (t, N) >= 0, extra (t, N, D') each."""
        t = self._check_chunk(features, saliency, extra)
        config, counts = self.config, self.counts
        stage = self._stage()
        x = features.float()
        if config.ratio >= 1.0:  # every token comes out as it is
            raise_unless_clean(inputs_clean(inverse_norms(x), saliency), x, saliency)
            self._parts["kept"].append(features.reshape(t * self.tokens, -1).clone())
            self._keep_extra([e.reshape(t * self.tokens, -1).clone() for e in extra])
            self.added += t
            return
        path = choose(features.device, self.backend)
        with stage("similarity"):
            w = normalize_saliency(saliency)  # w_t,i
            sim, inv_norm = gram_cosine(x)  # sim(x_t,i, x_t,j), 1 / ||x_t,i||
            clean = inputs_clean(inv_norm, saliency)
            if self._deferred(features.device, path):  # what `raise_unless_clean` would name, kept on the device
                flags = torch.stack((clean, ~(saliency < 0).any(), torch.isfinite(x).all()))
                self._clean = flags if self._clean is None else self._clean & flags
            else:
                raise_unless_clean(clean, x, saliency)
        with stage("selection"):
            selected = select_from_similarity(sim, w, counts.K, config.spatial, backend=path)  # S_t, (t, K)
        local = (selected + torch.arange(t, device=x.device).unsqueeze(-1) * self.tokens).reshape(-1)
        self._parts["selected"].append(selected)
        with serial(x.device, t * counts.K * x.shape[-1]):  # row gathers, on one CPU thread (threads.py)
            kept = features.reshape(t * self.tokens, -1).index_select(0, local).view(t, counts.K, -1)
            self._keep_extra([e.reshape(t * self.tokens, -1).index_select(0, local).view(t, counts.K, -1)
                              for e in extra])
        self._parts["kept"].append(kept)
        self.added += t
        if self.groups == 1:  # the spatial stage only
            return
        with stage("mass"):
            if config.mass == "uniform":
                mass = torch.full((t, counts.K), 1.0 / counts.K, device=x.device)
            else:
                mass = mass_from_similarity(sim, w, selected, config.tau_m, config.spatial)  # m_t
            del sim
        self._parts["mass"].append(mass)
        with stage("cost"):
            with serial(x.device, kept.numel()):  # = x's rows (the same rounding); float32: no copy at all
                chosen = kept.float()
            chosen_inv = inv_norm.reshape(-1)[local].view(t, counts.K)
            positions = grid_positions(selected, self.grid)
            now = (x, inv_norm, chosen, chosen_inv, positions)
            if self._last is not None:  # the pair from the previous chunk's last group to this chunk's first
                now = tuple(torch.cat((before, part)) for before, part in zip(self._last, now))
            self._last = tuple(part[-1:] for part in now)
            if now[0].shape[0] > 1:
                x_all, inv_all, chosen_all, chosen_inv_all, positions_all = now
                alpha = mixing_weight(x_all, self.grid, config.alpha, inv_all)  # alpha_t
                cost = transport_cost(chosen_all, positions_all, alpha, self.grid, chosen_inv_all,
                                      config.semantic_cost, config.location_norm)  # C_t
                self._parts["alpha"].append(alpha)
                self._parts["cost"].append(cost)

    def finish(self) -> Compressed:
        """The compression of every group added: budgets over all pairs, matching, merge (Sec. 3.4)."""
        if self.added != self.groups:
            raise ValueError(f"{self.added} of {self.groups} groups were added: add the rest before finish()")
        config, counts, report = self.config, self.counts, self.report
        groups, tokens = self.groups, self.tokens
        device = self._device
        parts = {name: _joined(chunks) for name, chunks in self._parts.items()}
        extras = [_joined(chunks) for chunks in self._extra]
        self._parts = {name: [] for name in self._parts}
        self._extra, self._last = [], None
        kept_rows = parts["kept"]
        if config.ratio >= 1.0:
            report.K, report.kept = tokens, groups * tokens
            every = torch.arange(groups * tokens, device=device)
            return Compressed(features=kept_rows, index=every, assignment=every.clone(), report=report,
                              selected=every.view(groups, tokens).clone(),
                              extra=_merged([e.float() for e in extras]))
        selected = parts["selected"]
        flat_selected = (selected + torch.arange(groups, device=device).unsqueeze(-1) * tokens).reshape(-1)
        chosen = kept_rows.reshape(groups * counts.K, -1)
        if groups == 1:  # spatial stage only
            report.kept = counts.K
            assignment = torch.full((tokens,), -1, dtype=torch.long, device=device)
            assignment[flat_selected] = torch.arange(counts.K, device=device)
            add_total_time(report)
            return Compressed(features=chosen, index=flat_selected, assignment=assignment, report=report,
                              selected=selected, extra=_merged([e.reshape(counts.K, -1).float() for e in extras]))
        stage = self._stage()
        mass, alpha, cost = parts["mass"], parts["alpha"], parts["cost"]
        path = choose(device, self.backend)
        cap = pair_cap(counts.K, config.budget_cap)
        with stage("sinkhorn"):
            plan, iterations, error, difficulty = solve_transport(
                mass[:-1], mass[1:], cost, config.eps, config.max_iter, config.tol,
                early_stop=config.sinkhorn_stop == "tol", backend=path)  # P_t, W_t
        with stage("budget"):
            if config.budget == "uniform":
                budgets, rounds = uniform_budget(groups - 1, counts.B_tot, cap), 0
            else:
                # one transfer: W_t in float64 (as the allocation computes) and the input check
                flags = self._clean if self._clean is not None else torch.ones(3, dtype=torch.bool, device=device)
                host = torch.cat((difficulty.double(), flags.double())).cpu()
                _refuse(host[-3:].tolist())
                budgets, rounds = allocate_budget_rounds(host[:-3], counts.B_tot, cap, config.tau_b,
                                                         config.budget_rounding)  # B_t
            kept = groups * counts.K - int(budgets.sum())  # each operation removes one token
            budgets = to_device(budgets, device)
        with stage("merge"), serial(device, chosen.numel()):  # gathers and sums, on one CPU thread (threads.py)
            matching = match_pairs(plan, cost, budgets, config.tau_c, inclusive=config.merge_rule == "inclusive")
            components = collapse(matching, groups, kept)
            out = average_components(chosen.float(), components).to(self._dtype)
            index = flat_selected[components.roots]
            assignment = torch.full((groups * tokens,), -1, dtype=torch.long, device=device)
            assignment[flat_selected] = components.row
            merged = [average_components(e.reshape(groups * counts.K, -1).float(), components) for e in extras]

        # The per-pair numbers of the report, in one device-to-host transfer (all exact in float32).
        per_pair = torch.stack((alpha.float(), difficulty.float(), budgets.float(),
                                matching.merged.sum(-1).float(), matching.pruned.sum(-1).float()))
        tail = torch.stack((error.max().float(), iterations.float()))
        numbers = torch.cat((per_pair.reshape(-1), tail)).cpu()
        per_pair_list, worst_error = numbers[:-2].view(5, -1).tolist(), float(numbers[-2])
        report.kept = kept
        report.alpha, report.W = per_pair_list[0], per_pair_list[1]
        report.B, report.merges, report.prunes = ([int(v) for v in row] for row in per_pair_list[2:])
        report.overflow_rounds = rounds
        report.sinkhorn_iterations = int(numbers[-1])
        report.sinkhorn_error = worst_error
        add_total_time(report)
        return Compressed(features=out, index=index, assignment=assignment, report=report, selected=selected,
                          extra=_merged(merged))

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors held for the groups added so far (what a long video accumulates)."""
        held = [t for chunks in self._parts.values() for t in chunks] + [t for c in self._extra for t in c]
        held += list(self._last or ())
        return sum(t.numel() * t.element_size() for t in held)

    # ------------------------------------------------------------------------------------------------

    def _stage(self) -> Any:
        device = self._device
        if device.type == "cpu" if self.timer is None else self.timer:
            return Stopwatch(device, self.report.timings_ms)
        return lambda name: nullcontext()

    def _deferred(self, device: torch.device, path: str) -> bool:
        """Whether the input check rides on the budget's transfer (as in `compress`): adaptive budget, T > 1,
        off the CPU or on the fused path."""
        return self.groups > 1 and self.config.budget == "adaptive" and (device.type != "cpu" or path == "triton")

    def _keep_extra(self, rows: list[torch.Tensor]) -> None:
        if not self._extra:
            self._extra = [[] for _ in rows]
        for held, part in zip(self._extra, rows):
            held.append(part)

    def _check_chunk(self, features: torch.Tensor, saliency: torch.Tensor, extra: Sequence[torch.Tensor]) -> int:
        if features.dim() != 3 or features.shape[0] < 1 or features.shape[-1] < 1:
            raise ValueError(f"features must be (t, N, D) with t, D >= 1, got shape {tuple(features.shape)}")
        if not features.is_floating_point():
            raise ValueError(f"features must be floating point, got {features.dtype}")
        t, n, dim = features.shape
        if n != self.tokens:
            raise ValueError(f"grid {self.grid} holds N = {self.tokens} tokens, got chunks of {n}")
        if tuple(saliency.shape) != (t, n):
            raise ValueError(f"saliency must be (t, N) = {(t, n)}, got {tuple(saliency.shape)}")
        if self.added + t > self.groups:
            raise ValueError(f"{self.added + t} groups added, more than the {self.groups} announced")
        if self._device is None:
            self._device, self._dtype, self._dim = features.device, features.dtype, dim
            if extra:
                self._extra = [[] for _ in extra]
        elif (features.device, features.dtype, dim) != (self._device, self._dtype, self._dim):
            raise ValueError(f"every chunk must have the first's device, dtype and width "
                             f"({self._device}, {self._dtype}, D = {self._dim})")
        if len(extra) != len(self._extra) or any(tuple(e.shape[:2]) != (t, n) for e in extra):
            raise ValueError(f"extra must be {len(self._extra)} tensors of shape (t, N, D') = ({t}, {n}, D') a chunk")
        return t


def _joined(chunks: list[torch.Tensor]) -> torch.Tensor | None:
    """The chunks along the first dimension (the one chunk itself, not a copy of it)."""
    return None if not chunks else chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _refuse(flags: list[float]) -> None:
    """ValueError naming what is wrong with an input whose check was deferred: flags are (clean,
    no negative saliency, finite features), as `ottvid.raise_unless_clean` tells them apart."""
    clean, non_negative, finite = (bool(v) for v in flags)
    if clean:
        return
    if not non_negative:
        raise ValueError("saliency must be non-negative")
    if not finite:
        raise ValueError("features contain NaN or Inf")
    raise ValueError("features are too large for float32 cosine similarities")


def _merged(rows: list[torch.Tensor]) -> dict[str, Any]:
    return {"merged": tuple(rows)} if rows else {}
