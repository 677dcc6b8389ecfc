"""Hugging Face models (small configs, random init) on the CPU plugin through oar.torch against the
same weights on torch's CPU: forward logits within 1e-4 of the largest logit, a training step's
loss within rel 1e-5 and every gradient within 1e-4 of that parameter's largest gradient."""

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import oar  # noqa: E402


def _gpt2(tied: bool):
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, tie_word_embeddings=tied)
    return transformers.GPT2LMHeadModel(config)


def _llama(tied: bool):
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=32, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(config)


def _check_train_step(npu, make):
    torch.manual_seed(0)
    cpu_model = make().train()
    npu_model = make().train()
    npu_model.load_state_dict(cpu_model.state_dict())
    npu_model.to(npu)
    ids = torch.randint(0, 128, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = cpu_model(ids, labels=ids)
        got = npu_model(ids.to(npu), labels=ids.to(npu))
        expected.loss.backward()
        got.loss.backward()
    scale = expected.logits.abs().max().item()
    assert (got.logits.cpu() - expected.logits).abs().max().item() <= 1e-4 * scale
    assert got.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    for (name, p_cpu), p_npu in zip(cpu_model.named_parameters(), npu_model.parameters()):
        error = (p_npu.grad.cpu() - p_cpu.grad).abs().max().item()
        assert error <= 1e-4 * p_cpu.grad.abs().max().item() + 1e-8, f"{name}: gradient error {error}"


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_train_step_matches_cpu(npu, make):
    _check_train_step(npu, lambda: make(tied=False))


def test_gpt2_tied_embeddings_train_step_matches_cpu(npu):
    _check_train_step(npu, lambda: _gpt2(tied=True))


def test_module_to_device_keeps_tied_parameters(npu):
    first, second = torch.nn.Linear(3, 3, bias=False), torch.nn.Linear(3, 3, bias=False)
    second.weight = first.weight
    pair = torch.nn.ModuleList([first, second]).to(npu)
    assert pair[0].weight is pair[1].weight
