"""`train` reads Datasets and loaders batch by batch: bit-identical to tensors, never gathered,
every batch checked as it comes."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from peg.train import Recipe, load_checked, train
from peg.train.checkpoint import CHECKPOINT_FORMAT


def mlp(seed=0, d=4, c=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, c))


def data(n=100, d=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


RECIPE = Recipe(epochs=3, batch_size=16, lr=0.1, schedule="cosine")


def test_tensors_dataset_and_loader_give_bit_identical_weights():
    X, y = data()
    ref, hist = train(mlp(), (X, y), RECIPE, seed=3)
    ds = TensorDataset(X, y)
    loader = DataLoader(ds, batch_size=5, shuffle=True)  # its sampler and batch size unused
    for source in (ds, loader):
        net, h = train(mlp(), source, RECIPE, seed=3)
        assert torch.equal(weights(net), weights(ref))
        assert h == hist


def test_augmented_images_bit_identical():
    g = torch.Generator().manual_seed(1)
    X, y = torch.rand(40, 3, 8, 8, generator=g), torch.randint(0, 3, (40,), generator=g)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(192, 3))

    recipe = Recipe(epochs=2, batch_size=8, augment=True)
    ref, _ = train(net(), (X, y), recipe, seed=5)
    other, _ = train(net(), TensorDataset(X, y), recipe, seed=5)
    assert torch.equal(weights(ref), weights(other))


class Counting(Dataset):
    """Items made on the fly; counts reads."""

    def __init__(self, X, y, as_dict=False):
        self.X, self.y, self.as_dict = X, y, as_dict
        self.reads = torch.zeros(len(X), dtype=torch.long)

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        self.reads[i] += 1
        if self.as_dict:
            return {"features": self.X[i], "labels": self.y[i]}
        return self.X[i], self.y[i]


def test_each_item_is_read_once_per_epoch():
    X, y = data(50)
    ds = Counting(X, y)
    net, _ = train(mlp(), ds, RECIPE, seed=0)
    assert torch.equal(ds.reads, torch.full((50,), RECIPE.epochs))
    ref, _ = train(mlp(), (X, y), RECIPE, seed=0)
    assert torch.equal(weights(net), weights(ref))


class Keyword(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = mlp()

    def forward(self, features):
        return self.body(features)


def test_dict_items_train_a_keyword_model_like_tensors():
    X, y = data(40)
    net, _ = train(Keyword(), Counting(X, y, as_dict=True), RECIPE, seed=1)
    ref, _ = train(mlp(), (X, y), RECIPE, seed=1)
    assert torch.equal(weights(net), weights(ref))


def test_batch_fn_splits_other_batches():
    X, y = data(40)
    ds = [{"x": X[i], "target": y[i]} for i in range(len(X))]
    loader = DataLoader(ds, batch_size=3)  # a list of dicts: a map-style dataset
    net, _ = train(mlp(), loader, RECIPE, seed=1, batch_fn=lambda b: (b["x"], b["target"]))
    ref, _ = train(mlp(), (X, y), RECIPE, seed=1)
    assert torch.equal(weights(net), weights(ref))


class Stream(IterableDataset):
    def __init__(self, X, y, bad_batch=None, batch_size=32):
        self.X, self.y, self.bad_batch, self.batch_size = X, y, bad_batch, batch_size
        self.order = []

    def __iter__(self):
        for i in range(len(self.X)):
            self.order.append(i)
            label = self.y[i]
            if self.bad_batch is not None and i // self.batch_size == self.bad_batch:
                label = torch.tensor(7)
            yield self.X[i], label


def test_iterable_dataset_trains_in_stream_order():
    X, y = data(64)
    ds = Stream(X, y)
    recipe = Recipe(epochs=2, batch_size=16, lr=0.1, schedule="constant")
    net, hist = train(mlp(), ds, recipe, seed=0)
    assert ds.order == list(range(64)) * 2
    assert len(hist) == 2
    # the same as tensors whose permutation is the identity: one epoch over (X, y) in order
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=recipe.weight_decay)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ref.train()
        for _ in range(2):
            for s in range(0, 64, 16):
                loss = nn.functional.cross_entropy(ref(X[s : s + 16]), y[s : s + 16])
                opt.zero_grad()
                loss.backward()
                opt.step()
    assert torch.allclose(weights(net), weights(ref), atol=1e-6)


def test_cosine_on_a_stream_without_length_is_refused():
    X, y = data(64)
    with pytest.raises(ValueError, match="cosine"):
        train(mlp(), Stream(X, y), Recipe(epochs=1, schedule="cosine"))


def test_bad_labels_in_batch_3_name_it_and_write_no_checkpoint(tmp_path):
    X, y = data(160)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(ValueError, match=r"batch 3 of epoch 1 \(samples 96:128 of the stream"):
        train(
            mlp(),
            Stream(X, y, bad_batch=3),
            Recipe(epochs=2, batch_size=32, schedule="constant"),
            checkpoint=ckpt,
        )
    assert not ckpt.exists()


def test_bad_data_in_a_later_epoch_keeps_the_last_good_checkpoint(tmp_path):
    X, y = data(40)
    ds = Counting(X, y)

    def spoil(epoch, model):
        ds.X = ds.X.clone()
        ds.X[11, 0] = float("nan")

    ckpt = tmp_path / "run.pt"
    recipe = Recipe(epochs=3, batch_size=8)
    match = r"data: batch \d of epoch 2 \(samples .*dataset indices.*NaN"
    with pytest.raises(ValueError, match=match):
        train(mlp(), ds, recipe, callbacks=[spoil], checkpoint=ckpt)
    identity = {"format": CHECKPOINT_FORMAT, "recipe": recipe.to_dict(), "seed": 0}
    assert load_checked(ckpt, identity, "checkpoint")["epoch"] == 1


def test_first_batch_checked_before_any_step():
    X, y = data(40)
    y[0] = 5  # out of range for 3 classes; fetched in some batch of epoch 1
    net = mlp()
    before = weights(net).clone()
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        train(net, Stream(X, y), Recipe(epochs=1, batch_size=8, schedule="constant"))
    assert torch.equal(weights(net), before)


def test_dataset_without_labels_is_refused():
    X, _ = data(20)
    with pytest.raises(ValueError, match="batch 0.*no labels"):
        train(mlp(), DataLoader(X, batch_size=4), Recipe(epochs=1))


def test_loader_workers_read_the_same_batches():
    X, y = data(40)
    ref, _ = train(mlp(), (X, y), RECIPE, seed=2)
    loader = DataLoader(TensorDataset(X, y), batch_size=4, num_workers=1)
    net, _ = train(mlp(), loader, RECIPE, seed=2)
    assert torch.equal(weights(net), weights(ref))
