"""OTT-Vid: optimal-transport temporal token compression (pure PyTorch, model-agnostic)."""

from .budget import allocate_budget, allocate_budget_rounds, uniform_budget
from .config import OTTVidConfig
from .merge import collapse, match_pairs
from .ottvid import TokenCounts, token_counts
from .stream import OTTVidStream, compress
from .spatial import cosine_similarity, normalize_saliency, select_tokens, token_mass
from .transport import marginal_error, mixing_weight, sinkhorn, transport_cost, transport_difficulty
from .types import CompressionReport, Compressed

__all__ = [
    "OTTVidConfig",
    "Compressed",
    "CompressionReport",
    "TokenCounts",
    "compress",
    "OTTVidStream",
    "token_counts",
    "select_tokens",
    "token_mass",
    "normalize_saliency",
    "cosine_similarity",
    "mixing_weight",
    "transport_cost",
    "sinkhorn",
    "marginal_error",
    "transport_difficulty",
    "allocate_budget",
    "allocate_budget_rounds",
    "uniform_budget",
    "match_pairs",
    "collapse",
]
