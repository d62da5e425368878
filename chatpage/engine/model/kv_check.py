"""What an int8 KV cache costs a model, measured: the same tokens run once over a bf16 cache and
once over an int8 one, compared position by position (the llama.cpp way: mean KL divergence of
the next-token distributions, perplexity, top-1 agreement).

The engine measures it on :data:`CALIBRATION` before it runs a model with int8 KV and refuses a
model over :data:`MAX_KLD` (a model whose keys or values have outliers that one scale per row
cannot hold). The refusal reads the divergence alone: it is a mean over every position and holds
still (the default model: 0.0016 on these 200 tokens and on bench quality's 940), where the
perplexity of 200 tokens moves by tenths of a percent with the kernels' order of summation (the
same cache: +0.36% through the torch reference, +0.50% through the CPU kernels; +0.05% over the
940). ``chatpage bench quality`` measures both against the goals on its longer text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chatpage.engine.model.kv_cache import row_size
from chatpage.engine.model.llama import AttentionMetadata, LlamaModel

MAX_KLD = 0.005
"""The mean KL divergence (nats per token) of int8 KV against bf16 KV an engine accepts."""
MAX_PPL_CHANGE = 0.005
"""The relative perplexity increase of int8 KV against bf16 KV that is the goal (+0.5%, over
``chatpage bench quality``'s text)."""

CALIBRATION = (
    "The old lighthouse stood at the end of a narrow spit of rock, and for a hundred years its "
    "keepers had written the weather in a book that was kept on the table by the stairs. Each "
    "entry gave the hour, the wind, the state of the sea and the ships that passed. In the winter "
    "of the great storm the keeper wrote that the waves reached the lamp room, that the glass "
    "shook in its frame, and that he kept the light burning all night with the last of the oil. "
    "When the supply boat came a week later, the crew found him asleep in his chair, the book open "
    "in front of him, and the lamp still warm. The next spring the town raised money for a new "
    "tower, but the keeper asked to stay in the old one, and the council, who could not think of "
    "a reason to refuse him, agreed. He lived there for another twenty years and never missed a "
    "night. Today the book is in the museum by the harbour, and children read the entries aloud."
)


@dataclass(frozen=True)
class KVLoss:
    """int8 KV against a base (bf16) KV cache over the same tokens."""

    tokens: int
    kld: float  # mean KL(base || int8) of the next-token distributions, nats
    base_perplexity: float
    perplexity: float
    top1: float  # the fraction of positions whose argmax is the base's

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.base_perplexity - 1

    @property
    def acceptable(self) -> bool:
        return self.kld <= MAX_KLD

    def describe(self) -> str:
        return (
            f"mean KL divergence {self.kld:.4f} (limit {MAX_KLD}), perplexity "
            f"{self.perplexity_change:+.2%}, top-1 agreement "
            f"{self.top1:.1%} over {self.tokens} tokens"
        )


@torch.inference_mode()
def logits_over(
    model: LlamaModel, ids: list[int], kv_dtype: torch.dtype, block_size: int
) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` of every position of ``ids`` as one prompt, over a scratch KV
    cache of ``kv_dtype`` just large enough (one pool per layer)."""
    device, n = model.device, len(ids)
    blocks = -(-n // block_size)
    shape = (blocks, block_size, model.num_kv_heads, row_size(model.head_dim, kv_dtype))
    k = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
    v = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device).unsqueeze(0),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
    )
    positions = torch.arange(n, device=device)
    tokens = torch.tensor(ids, dtype=torch.int64, device=device)
    return model.forward(tokens, positions, meta, k, v, positions).float()


def compare(base: torch.Tensor, int8: torch.Tensor, ids: list[int]) -> KVLoss:
    """:class:`KVLoss` of the logits ``int8`` against ``base`` (both ``[len(ids), vocab]``)."""
    base_lp, lp = F.log_softmax(base, dim=-1), F.log_softmax(int8, dim=-1)
    kld = (base_lp.exp() * (base_lp - lp)).sum(dim=-1).mean().item()
    target = torch.tensor(ids[1:], device=base.device)
    return KVLoss(
        tokens=len(ids),
        kld=max(kld, 0.0),
        base_perplexity=math.exp(F.nll_loss(base_lp[:-1], target).item()),
        perplexity=math.exp(F.nll_loss(lp[:-1], target).item()),
        top1=(base.argmax(-1) == int8.argmax(-1)).float().mean().item(),
    )


def int8_loss(model: LlamaModel, ids: list[int], block_size: int, base: torch.dtype) -> KVLoss:
    """What int8 KV costs ``model`` on ``ids`` against a ``base`` cache."""
    return compare(
        logits_over(model, ids, base, block_size),
        logits_over(model, ids, torch.int8, block_size),
        ids,
    )
