"""What every compression method takes and returns, shared by OTT-Vid (ottvid.py, stream.py) and the peer
methods (methods/): the input shape check (`check_shapes`), the report (`CompressionReport`) and the
result (`Compressed`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .merge import Collapse, average_components


def check_shapes(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int]) -> tuple[int, int]:
    """(T, N) of features (T, N, D), floating point; ValueError unless saliency is (T, N) and grid (H, W) holds N."""
    if features.dim() != 3:
        raise ValueError(f"features must be (T, N, D), got shape {tuple(features.shape)}")
    groups, tokens, dim = features.shape
    if groups < 1 or tokens < 1 or dim < 1:
        raise ValueError(f"features must have T, N, D >= 1, got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise ValueError(f"features must be floating point, got {features.dtype}")
    if tuple(saliency.shape) != (groups, tokens):
        raise ValueError(f"saliency must be (T, N) = {(groups, tokens)}, got {tuple(saliency.shape)}")
    if len(grid) != 2 or int(grid[0]) * int(grid[1]) != tokens or min(grid) < 1:
        raise ValueError(f"grid {tuple(grid)} does not hold N = {tokens} tokens")
    return groups, tokens


@dataclass
class CompressionReport:
    """What compress() did, as plain data (JSON-serialisable through `to_dict`).

    Per-pair lists (length T-1): alpha, W (transport difficulty), B (budget), merges, prunes.
    sinkhorn_error is the largest marginal error |P1 - a|_1 + |P^T1 - b|_1 over the pairs.
    timings_ms holds the wall time of each stage when they are timed (see compress's `timer`).
    """

    T: int
    N: int
    K: int
    M: int
    r_s: float
    r_t: float
    B_tot: int
    kept: int = 0
    alpha: list[float] = field(default_factory=list)
    W: list[float] = field(default_factory=list)
    B: list[int] = field(default_factory=list)
    merges: list[int] = field(default_factory=list)
    prunes: list[int] = field(default_factory=list)
    overflow_rounds: int = 0
    sinkhorn_iterations: int = 0
    sinkhorn_error: float = 0.0
    timings_ms: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Compressed:
    """features (M, D) in the input dtype; index (M,) flat original index t*N + n of each output
    token's root, ascending; assignment (T*N,) output row representing each input token, -1 if
    dropped; report: CompressionReport; selected (T, K) the tokens the spatial stage kept per group,
    ascending (what tells spatially from temporally pruned tokens apart).

    mixing: the exact merge map, a sparse (M, T*N) float32 matrix (COO or CSR, on the features'
    device) with features == mixing @ flat input (up to float rounding), for methods whose outputs
    are weighted combinations; None means each output row is the uniform average of its
    `assignment` members (OTT-Vid, pure pruning). `apply` merges any other per-token tensor with
    the same decisions (Qwen3-VL's DeepStack features).

    order: the sequence in which the LLM receives the output rows, a permutation (M,) long of
    0..M-1 on the features' device: the LLM's i-th visual token is row order[i]. None (the default,
    every method but VisionZip with layout="official") means ascending `index`, i.e. the rows as
    they are. It changes only where rows sit in the sequence, never the rows, `index` (still
    ascending), `assignment` or `apply` (rows in `index` order). LLaVA-OneVision fills its visual
    slots in this order (1-D positions, renumbered in sequence); the M-RoPE backbones (Qwen2.5-VL,
    Qwen3-VL), whose positions come from each row's root, refuse a Compressed with an order."""

    features: torch.Tensor
    index: torch.Tensor
    assignment: torch.Tensor
    report: CompressionReport
    selected: torch.Tensor | None = None  # (T, K) tokens the spatial stage kept in each group
    mixing: torch.Tensor | None = None  # sparse (M, T*N) float32, None: uniform over `assignment`
    order: torch.Tensor | None = None  # (M,) LLM sequence order of the rows, None: ascending index
    # other per-token tensors merged with these decisions while streaming (`stream.OTTVidStream`'s `extra`):
    # "merged", a tuple of (M, D') float32 in `index` order, what `apply` gives for the whole tensors
    extra: dict = field(default_factory=dict)

    def sequence(self) -> torch.Tensor:
        """(M,) the rows in the order the LLM receives them: `order`, or 0..M-1 when it is None."""
        if self.order is None:
            return torch.arange(self.index.numel(), device=self.index.device)
        return self.order

    def apply(self, rows: torch.Tensor) -> torch.Tensor:
        """The same merge applied to another per-token tensor: rows (T*N, D') in the input's flat
        order -> (M, D') float32 on rows' device. Without `mixing`: each output the uniform average
        of its assignment members by compression's own `average_components` (a token kept alone
        comes out bit-identical; ottvid's main features are reproduced bit for bit); with it, the
        sparse product mixing @ rows (a token kept alone has the single weight 1: bit-identical).
        Rows come back in `index` order whatever `order` says (take `[self.sequence()]` for the
        LLM's order)."""
        tokens = self.assignment.numel()
        if rows.dim() != 2 or rows.shape[0] != tokens:
            raise ValueError(f"rows must be (T*N, D') = ({tokens}, D'), got shape {tuple(rows.shape)}")
        if self.mixing is not None:
            return self.mixing.to(rows.device) @ rows.float()
        assignment, roots = self.assignment.to(rows.device), self.index.to(rows.device)
        count = torch.zeros(roots.numel(), dtype=torch.long, device=rows.device)
        count.index_add_(0, assignment.clamp_min(0), (assignment >= 0).long())
        return average_components(rows, Collapse(row=assignment, roots=roots, count=count))
