"""The kinds of base the scale search's quality bar is checked on beyond the MNIST-like ones
(benchmarks/scale_search.py `--points-bases`): a CIFAR-10 CNN of the project's presets, a
ResNet and a ViT built from small transformers configs, a BERT text classifier from a small
config, and the UCI regression base. Each is trained here once and cached under
.peg-cache/scale-search/ (weights), so a rerun resumes.

Every function returns (base, val, test, regression): the model in eval mode, the validation
pool (the first n of it are used) and the test set, as tensor pairs.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import torch
from _bases import CACHE
from torch import Tensor, nn

import peg
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import find_spec, load_specs
from peg.apps.bench.uci import Split
from peg.train import Recipe, train

Pair = tuple[Tensor, Tensor]
Base = tuple[nn.Module, Pair, Pair, bool]
HERE = CACHE / "scale-search"


def _cifar_run(name: str = "cifar10-adam", **recipe: Any) -> SeedRun:
    """The cifar10-cpu preset's split (20k training, 10k validation, 5k test images) under
    another recipe: by default benchmarks/scale_search.py's cifar10-adam base (Adam, lr 1e-3,
    no weight decay, constant rate, 10 epochs: 55% accurate, over-fitted)."""
    spec = load_specs(find_spec("cifar10-cpu"))[0]
    options = dict(epochs=10, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="constant")
    spec = dataclasses.replace(spec, name=name, train=Recipe(**{**options, **recipe}), methods=())
    return SeedRun(spec, 0, HERE, progress=False)


def _shuffled(pair: Pair) -> Pair:
    """The pair in a fixed random order (seed 0): the preset's validation and test sets come in
    class order, so that their first n points would hold a few classes only."""
    order = torch.randperm(len(pair[1]), generator=torch.Generator().manual_seed(0))
    return pair[0][order], pair[1][order]


def cifar_cnn() -> Base:
    """The project's SmallCNN (width 32) on the cifar10-cpu preset's data, trained as users
    often do, Adam (lr 1e-3) without weight decay at a constant rate, with the preset's
    augmentation (random crops and flips) for 12 epochs: 65-80% accurate, over-confident."""
    run = _cifar_run("cifar10-augment", epochs=12, augment=True)
    return run.bases.get("single").eval(), _shuffled(run.val), _shuffled(run.test), False


def _hf_image(name: str, model: nn.Module, epochs: int, lr: float) -> Base:
    run = _cifar_run()
    wrapped = peg.with_output(model, "logits")
    recipe = Recipe(epochs=epochs, lr=lr, optimizer="adam", weight_decay=0.0, schedule="cosine")
    train(wrapped, run.train, recipe, seed=0, checkpoint=HERE / f"{name}.safetensors",
          progress=False)  # fmt: skip
    return wrapped.eval(), _shuffled(run.val), _shuffled(run.test), False


def hf_resnet() -> Base:
    """transformers' ResNetForImageClassification from a small config (3 stages of basic
    blocks, 16-64 channels, BatchNorm), trained 6 epochs on the same 20k CIFAR-10 images."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1],
        layer_type="basic", downsample_in_first_stage=False, num_labels=10,
    )  # fmt: skip
    return _hf_image("hf-resnet", transformers.ResNetForImageClassification(config), 6, 2e-3)


def hf_vit() -> Base:
    """transformers' ViTForImageClassification from a small config (patches of 8 pixels, 3
    layers of width 96, LayerNorm), trained 8 epochs on the same 20k CIFAR-10 images."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=96, num_hidden_layers=3,
        num_attention_heads=4, intermediate_size=192, num_labels=10,
    )  # fmt: skip
    return _hf_image("hf-vit", transformers.ViTForImageClassification(config), 8, 1e-3)


# ten installed Python libraries; a text's class is the library its docstring is in
PACKAGES = (
    "numpy", "scipy", "pandas", "matplotlib", "sklearn", "torch", "transformers", "sympy",
    "networkx", "hypothesis",
)  # fmt: skip
WINDOWS = 2500  # windows read per library at most (its files in sorted order)
TOKENS = 32  # tokens per text: windows of a package's docstrings, no padding
VOCAB = 4000


def _docstrings(package: str) -> list[str]:
    """The docstrings (module, class, function) of an installed library's source, files in
    sorted order, until about `WINDOWS` windows of `TOKENS` words are read."""
    import ast
    import importlib

    root = Path(inspect.getfile(importlib.import_module(package))).parent
    texts: list[str] = []
    words = 0
    for path in sorted(root.rglob("*.py")):
        if "test" in str(path.relative_to(root)) or words > WINDOWS * TOKENS * 1.2:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append(doc)
                    words += len(doc.split())
    return texts


def docstring_texts() -> tuple[Tensor, Tensor]:
    """Token windows `[N, TOKENS]` of the ten libraries' docstrings and their library `[N]`,
    shuffled (seed 0); words lower-cased, the `VOCAB` - 2 most frequent kept (1: unknown).
    Cached under .peg-cache/scale-search/ (reading them takes a minute)."""
    path = HERE / "docstring-texts.pt"
    if path.exists():
        return torch.load(path)
    words: list[list[str]] = []
    for package in PACKAGES:
        text = " ".join(_docstrings(package)).lower()
        words.append(re.findall(r"[a-z_]+|[0-9]+|[^\sa-z_0-9]", text))
    counts: dict[str, int] = {}
    for ws in words:
        for w in ws:
            counts[w] = counts.get(w, 0) + 1
    vocab = {w: i + 2 for i, w in enumerate(sorted(counts, key=lambda w: -counts[w])[: VOCAB - 2])}
    X, y = [], []
    for label, ws in enumerate(words):
        ids = torch.tensor([vocab.get(w, 1) for w in ws])
        windows = ids[: len(ids) // TOKENS * TOKENS].view(-1, TOKENS)[:WINDOWS]
        X.append(windows)
        y.append(torch.full((len(windows),), label))
    X_all, y_all = torch.cat(X), torch.cat(y)
    order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save((X_all[order], y_all[order]), path)
    return X_all[order], y_all[order]


def hf_bert() -> Base:
    """transformers' BertForSequenceClassification from a small config (2 layers of width 128)
    on `docstring_texts`: which of ten installed libraries a 32-token window of docstrings
    comes from; 4,000 test and 4,000 validation windows, the rest for training."""
    import transformers

    X, y = docstring_texts()
    test, val, rest = (X[:4000], y[:4000]), (X[4000:8000], y[4000:8000]), (X[8000:], y[8000:])
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256, max_position_embeddings=TOKENS, num_labels=10,
    )  # fmt: skip
    model = peg.with_output(transformers.BertForSequenceClassification(config), "logits")
    recipe = Recipe(epochs=4, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="cosine")
    train(model, rest, recipe, seed=0, checkpoint=HERE / "hf-bert.safetensors", progress=False)
    return model.eval(), val, test, False


def uci() -> Base:
    """The UCI power-plant base of the bench's uci preset (split 0, Gaussian MLP): its
    validation split (861 points: fewer than 2,000) and its test split."""
    split = Split("power-plant", 0, CACHE / "bench" / "uci", None, None)
    return split.single().eval(), split.val, split.test, True


BASES: dict[str, Any] = {
    "cifar-cnn": cifar_cnn,
    "hf-resnet": hf_resnet,
    "hf-vit": hf_vit,
    "hf-bert": hf_bert,
    "uci": uci,
}


if __name__ == "__main__":  # train (or load) the bases named, and print their accuracy
    import sys

    for name in sys.argv[1:]:
        base, val, test, regression = BASES[name]()
        with torch.no_grad():
            out = base(test[0][:2000])
        if regression:
            print(name, "test points", len(test[1]))
            continue
        acc = float((out.argmax(1) == test[1][:2000]).float().mean())
        nll = float(nn.functional.cross_entropy(out, test[1][:2000]))
        print(f"{name}: test accuracy {acc:.3f}, NLL {nll:.4f}; val {len(val[1])}, "
              f"test {len(test[1])}", flush=True)  # fmt: skip
