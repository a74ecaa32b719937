"""Small models, data and files the error cases (`ERROR_CASES` in the test modules) share."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import peg
from peg.train import Recipe


def raises_test(cases: Sequence[tuple[Any, ...]], files: bool = False) -> Callable[..., None]:
    """The test a module with error cases runs over them: each `(area, what, call, kind,
    regex)` raises `kind` matching `regex` (`call(tmp_path)` with `files=True`, the
    `FILE_ERROR_CASES`). Bound to a `test_*` name in the module::

        test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
    """
    ids = [f"{area}: {what}" for area, what, *_ in cases]
    parametrize = pytest.mark.parametrize("case", cases, ids=ids)

    @parametrize
    def test(case: tuple[Any, ...]) -> None:
        _, _, call, kind, regex = case
        with pytest.raises(kind, match=regex):
            call()

    @parametrize
    def test_files(case: tuple[Any, ...], tmp_path: Path) -> None:
        _, _, call, kind, regex = case
        with pytest.raises(kind, match=regex):
            call(tmp_path)

    return test_files if files else test


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _val(n: int = 200, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 2, generator=g), torch.randint(0, classes, (n,), generator=g)


class _TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        X, y = _val()
        return iter(zip(X, y, strict=True))


def _bad_batch_3() -> torch.utils.data.TensorDataset:
    X, y = _val()
    y = y.clone()
    y[65] = 7  # in batch 3 of 20 points
    return torch.utils.data.TensorDataset(X, y)


def _nan_batch_3() -> torch.utils.data.TensorDataset:
    X, y = _val()
    X = X.clone()
    X[70, 1] = float("nan")
    return torch.utils.data.TensorDataset(X, y)


def _bn_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _meta_mlp() -> nn.Module:
    return copy.deepcopy(_mlp()).to("meta")


def _wide() -> tuple[torch.Tensor, torch.Tensor]:
    """Validation data with 5 features, for a model that takes 2."""
    return torch.randn(200, 5), _val()[1]


def _nan_x() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val()
    X = X.clone()
    X[3, 0] = float("nan")
    return X, y


R1 = Recipe(epochs=1, batch_size=64)


def _frozen() -> nn.Module:
    net = _mlp()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _fitted_peg() -> peg.PEG:
    return peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, progress=False).fit(_mlp(), _val())


logits = torch.randn(2, 4, 3)


# ------------------------------------------------------------- tampered files (probes)
def tamper(path: str | Path, change: Callable[[Any], Any], key: str = "peg") -> str:
    """Rewrite the JSON under metadata `key` of safetensors file `path` with `change(parsed)`
    (its return value, or the parsed value changed in place; a str is written as it is). A peg
    archive's header digest is rewritten to match (a crafted file, which the checks after the
    digest must refuse on their own; `edit_header` keeps the old digest)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    parsed = json.loads(metadata[key])
    new = change(parsed)
    new = parsed if new is None else new
    metadata[key] = new if isinstance(new, str) else json.dumps(_redigested(new))
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def retensor(path: str | Path, change: Callable[[str, torch.Tensor], torch.Tensor]) -> str:
    """Rewrite every tensor of safetensors file `path` with `change(name, tensor)`, keeping
    its metadata; a peg archive's tensor digest is rewritten to match (a crafted file, which
    the checks after the digest must refuse on their own)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from peg.archive import tensors_digest

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {k: change(k, f.get_tensor(k)).contiguous() for k in f.keys()}  # noqa: SIM118
    header = json.loads(metadata.get("peg", "null"))
    if isinstance(header, dict) and "tensors_sha256" in header:
        header["tensors_sha256"] = tensors_digest(tensors)
        metadata["peg"] = json.dumps(_redigested(header))
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def _redigested(header: Any) -> Any:
    """`header` with its `header_sha256` (where it has one) recomputed."""
    if isinstance(header, dict) and isinstance(header.get("header_sha256"), str):
        from peg.archive import header_digest

        header["header_sha256"] = header_digest(header)
    return header


def edit_header(path: str | Path, change: Callable[[Any], Any]) -> str:
    """`tamper` without rewriting the header digest: an archive edited after it was written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    parsed = json.loads(metadata["peg"])
    change(parsed)
    metadata["peg"] = json.dumps(parsed)
    save_file(tensors, str(path), metadata=metadata)
    return str(path)
