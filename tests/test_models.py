"""The example models (oar.models) and their shipped data on the CPU reference plugin."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from oar.models import data

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


# ---- data (numpy only) -----------------------------------------------------------


def test_digits_shipped_and_split_deterministically():
    train, test = data.load_digits(test_fraction=0.2, seed=0)
    assert len(train) + len(test) == 1797 and len(test) == 359
    assert train.images.shape == (1438, 1, 8, 8) and train.images.dtype == np.float32
    assert train.labels.dtype == np.int64 and set(np.unique(train.labels)) == set(range(10))
    assert 0.0 <= train.images.min() and train.images.max() == 1.0
    again, _ = data.load_digits(test_fraction=0.2, seed=0)
    np.testing.assert_array_equal(train.images, again.images)
    other, _ = data.load_digits(test_fraction=0.2, seed=1)
    assert not np.array_equal(train.labels, other.labels)


def test_digits_batches_cover_an_epoch_in_a_seeded_order():
    train, _ = data.load_digits()
    first = [labels for _, labels in data.digits_batches(train, 100, seed=3, epoch=1)]
    assert sum(len(b) for b in first) == len(train)
    same = [labels for _, labels in data.digits_batches(train, 100, seed=3, epoch=1)]
    assert all(np.array_equal(a, b) for a, b in zip(first, same))
    other = [labels for _, labels in data.digits_batches(train, 100, seed=3, epoch=2)]
    assert not np.array_equal(np.concatenate(first), np.concatenate(other))
    images, _ = next(data.digits_batches(train, 10, seed=0, flat=True))
    assert images.shape == (10, 64)
    dropped = list(data.digits_batches(train, 100, seed=0, drop_last=True))
    assert all(len(labels) == 100 for _, labels in dropped) and len(dropped) == len(train) // 100


def test_corpus_is_english_text_of_the_promised_size():
    corpus = data.load_corpus()
    assert corpus.dtype == np.uint8 and 200_000 <= corpus.shape[0] <= 1_000_000
    text = bytes(corpus[:20_000]).decode("utf-8")
    assert " the " in text and "statement" in text
    assert data.decode(data.encode("héllo")) == "héllo"


def test_text_batches_are_a_function_of_seed_and_step():
    corpus = data.load_corpus()
    batches = data.TextBatches(corpus, batch_size=4, seq_len=32, seed=7)
    x, y = batches.batch(5)
    assert x.shape == y.shape == (4, 32) and x.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    np.testing.assert_array_equal(batches.batch(5)[0], data.TextBatches(corpus, 4, 32, seed=7).batch(5)[0])
    assert not np.array_equal(batches.batch(6)[0], x)
    vx, _ = batches.batch(5, "val")
    assert vx.max() < 256 and not np.array_equal(vx, x)
    with pytest.raises(ValueError):
        data.TextBatches(corpus[:10], batch_size=1, seq_len=32)


# ---- models on the device ---------------------------------------------------------


@pytest.fixture(scope="module")
def oar_dev(dev):
    import oar

    oar.set_device(dev)
    return oar.get_device()


def tiny_llama_config(**overrides):
    from oar.models.llama import LlamaConfig

    settings = dict(d_model=64, n_layers=2, n_heads=4, max_seq_len=32, seed=0)
    settings.update(overrides)
    return LlamaConfig(**settings)


def test_forward_shapes(oar_dev):
    import oar
    from oar.models import CNN, MLP
    from oar.models.llama import Llama

    images = oar.tensor(np.zeros((5, 1, 8, 8), np.float32), device=oar_dev)
    assert tuple(MLP().to(oar_dev)(images).shape) == (5, 10)
    assert tuple(CNN().to(oar_dev)(images).shape) == (5, 10)
    for tie in (True, False):
        model = Llama(tiny_llama_config(tie_embeddings=tie)).to(oar_dev)
        tokens = oar.tensor(np.zeros((3, 17), np.int64), device=oar_dev)
        assert tuple(model(tokens).shape) == (3, 17, 256)
        names = set(model.state_dict())
        assert ("head.weight" in names) != tie and "layers.1.mlp.w2.weight" in names


def test_llama_config_and_init_are_deterministic():
    from oar.models.llama import LlamaConfig, init_weights

    cfg = LlamaConfig()
    assert cfg.head_dim == 64 and cfg.d_ff == 704
    a, b = init_weights(cfg), init_weights(LlamaConfig())
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["tok_emb.weight"], init_weights(LlamaConfig(seed=1))["tok_emb.weight"])
    with pytest.raises(ValueError):
        LlamaConfig(d_model=100, n_heads=3)


def test_llama_training_steps_reduce_the_loss(oar_dev):
    import oar
    from oar.models.llama import Llama

    model = Llama(tiny_llama_config()).to(oar_dev)
    batches = data.TextBatches(data.load_corpus(), batch_size=8, seq_len=32, seed=0)
    x_np, y_np = batches.batch(0)
    x, y = oar.tensor(x_np, device=oar_dev), oar.tensor(y_np, device=oar_dev)
    opt = oar.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(256)) < 0.1  # untrained: about uniform over bytes
    assert losses[-1] < losses[0] - 0.5, losses


def test_llama_checkpoint_round_trip_and_seeded_generation(oar_dev, tmp_path):
    import oar
    from oar.models.llama import Llama

    model = Llama(tiny_llama_config(seed=5)).to(oar_dev)
    path = tmp_path / "llama.safetensors"
    oar.save(model.state_dict(), path)
    fresh = Llama(tiny_llama_config(seed=6)).to(oar_dev)
    fresh.load_state_dict(oar.load(path, device=oar_dev))
    tokens = oar.tensor(data.encode("Assignment statements")[None, :], device=oar_dev)
    with oar.no_grad():
        np.testing.assert_array_equal(model(tokens).numpy(), fresh(tokens).numpy())
    prompt = data.encode("The ")
    sampled = model.generate(prompt, 12, temperature=0.8, seed=1)
    assert sampled.shape == (12,) and sampled.dtype == np.int64 and sampled.max() < 256
    np.testing.assert_array_equal(sampled, fresh.generate(prompt, 12, temperature=0.8, seed=1))
    greedy = model.generate(prompt, 40, temperature=0.0)  # longer than max_seq_len: the context slides
    np.testing.assert_array_equal(greedy, model.generate(prompt, 40, temperature=0.0, seed=9))
    assert model.training


def test_cnn_training_steps_reduce_the_loss(oar_dev):
    import oar
    import oar.nn.functional as F
    from oar.models import CNN

    oar.manual_seed(0)
    train, _ = data.load_digits()
    images, labels = next(data.digits_batches(train, 64, seed=0))
    x, y = oar.tensor(images, device=oar_dev), oar.tensor(labels, device=oar_dev)
    model = CNN().to(oar_dev)
    opt = oar.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7, losses


def test_digits_mlp_reaches_a_sane_accuracy(oar_dev):
    import oar
    import oar.nn.functional as F
    from oar.models import MLP

    oar.manual_seed(0)
    train, test = data.load_digits(seed=0)
    model = MLP().to(oar_dev)
    opt = oar.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(3):
        for images, labels in data.digits_batches(train, 32, seed=0, epoch=epoch, flat=True):
            loss = F.cross_entropy(model(oar.tensor(images, device=oar_dev)), oar.tensor(labels, device=oar_dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
    with oar.no_grad():
        logits = model(oar.tensor(test.flat(), device=oar_dev)).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == test.labels))
    assert accuracy >= 0.9, accuracy


@pytest.fixture(scope="module")
def torch_twin_module():
    pytest.importorskip("torch")
    sys.path.insert(0, BENCH)
    try:
        import train_step
    finally:
        sys.path.remove(BENCH)
    return train_step


@pytest.mark.parametrize("tie", [True, False])
def test_llama_matches_the_pytorch_twin(oar_dev, torch_twin_module, tie):
    import torch

    import oar
    from oar.models.llama import Llama, init_weights

    cfg = tiny_llama_config(tie_embeddings=tie, seed=3)
    model = Llama(cfg).to(oar_dev)
    twin = torch_twin_module.torch_twin(cfg, init_weights(cfg))
    tokens_np, targets_np = data.TextBatches(data.load_corpus(), 2, 24, seed=1).batch(0)

    logits = model(oar.tensor(tokens_np, device=oar_dev)).numpy()
    expected = twin(torch.from_numpy(tokens_np)).detach().numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)

    # and the gradients of the loss agree
    loss = model.loss(oar.tensor(tokens_np, device=oar_dev), oar.tensor(targets_np, device=oar_dev))
    loss.backward()
    tloss = twin.loss(torch.from_numpy(tokens_np), torch.from_numpy(targets_np))
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-4)
    ours = dict(model.named_parameters())
    for name, param in twin.named_parameters():
        np.testing.assert_allclose(ours[name].grad.numpy(), param.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)
