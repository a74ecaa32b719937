"""Tiny HuggingFace models and dict batches, as the tests of peg with transformers use them.

The models are transformers' `ViTForImageClassification`, `ResNetForImageClassification` and
`BertForSequenceClassification` built from tiny configurations: random weights (seed them
before building), a few thousand parameters, nothing fetched from a hub. The data are dicts of
tensors, as a HuggingFace dataset with `set_format("torch")` gives them: `{"pixel_values",
"labels"}` or `{"input_ids", "attention_mask", "labels"}`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import transformers  # peg[hf], installed by scripts/setup.sh: CI runs these tests
from torch import nn
from torch.utils.data import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be fetched
CLASSES = 3


class Items(Dataset):
    """Items are dicts of tensors, as a HuggingFace dataset with `set_format("torch")`."""

    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.data.items()}


def vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=CLASSES,
    )
    return transformers.ViTForImageClassification(config)


def resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=CLASSES
    )
    return transformers.ResNetForImageClassification(config)


def bert(**config: Any) -> transformers.BertForSequenceClassification:
    """One layer of width 16 over a vocabulary of 20 tokens, 3 classes; `config` overrides any
    of `BertConfig`'s arguments (a larger model, another vocabulary)."""
    tiny: dict[str, Any] = {
        "vocab_size": 20,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
        "num_labels": CLASSES,
    }
    return transformers.BertForSequenceClassification(transformers.BertConfig(**tiny | config))


def images(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "pixel_values": torch.randn(n, 3, 16, 16, generator=g),
        "labels": torch.randint(0, CLASSES, (n,), generator=g),
    }


def tokens(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 9, (n,), generator=g)
    mask = (torch.arange(8)[None] < lengths[:, None]).long()
    return {
        "input_ids": torch.randint(1, 20, (n, 8), generator=g) * mask,
        "attention_mask": mask,
        "labels": torch.randint(0, CLASSES, (n,), generator=g),
    }
