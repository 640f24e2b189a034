"""torch and transformers as producers and readers (scripts/ci/interop.sh --full)."""

import os

import numpy as np
import pytest

import stio

pytestmark = pytest.mark.full

try:
    import safetensors.torch
    import torch

    import producers_torch
except ImportError:  # light mode: every test here is deselected (-m "not full")
    torch = None


@pytest.fixture(autouse=True)
def _needs_torch():
    if torch is None:
        pytest.skip("torch is not installed (scripts/ci/interop.sh --full installs it)")

ENCODINGS = ["xor", "overwrite"]


def _change_some_bytes(tensors, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in tensors.items():
        t = t.clone()
        if t.numel() and not name.startswith("int64"):
            u8 = t.reshape(-1).view(torch.uint8)
            i = int(rng.integers(0, u8.numel()))
            u8[i] = int(u8[i]) ^ 1
        out[name] = t
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_torch_dtype(hf, tmp_path, encoding):
    """safetensors.torch.save_file with every dtype it writes (F4 included)."""
    t0 = producers_torch.all_dtypes_tensors(seed=3)
    t1 = _change_some_bytes(t0, 4)
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir()
    new.mkdir()
    safetensors.torch.save_file(t0, str(base / "model.safetensors"), metadata={"format": "pt"})
    safetensors.torch.save_file(t1, str(new / "model.safetensors"), metadata={"format": "pt"})
    dtypes = {v["dtype"] for k, v in stio.read_header(str(base / "model.safetensors"))[1].items() if k != "__metadata__"}
    assert set(producers_torch.available().values()) <= dtypes
    out = str(tmp_path / "weight_v000001")
    hf.diff(str(base), str(new), out, encoding)
    local = str(tmp_path / "local")
    hf.init(str(base), local)
    hf.apply(out, local)
    stio.assert_same_tree(local, str(new))
    back = safetensors.torch.load_file(os.path.join(local, "model.safetensors"))
    for name, t in t1.items():
        assert producers_torch.raw_bytes(back[name]) == producers_torch.raw_bytes(t), name
        assert back[name].dtype == t.dtype and back[name].shape == t.shape


# ------------------------------------------------------------ transformers


def _tiny_model(seed):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    return transformers, model


def _load(transformers, path):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    except TypeError:  # older transformers
        return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def llama_saves(tmp_path_factory):
    """save_pretrained before and after one AdamW step (and one more step)."""
    root = tmp_path_factory.mktemp("llama")
    transformers, model = _tiny_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    paths = []
    for i in range(3):
        d = str(root / f"save_{i}")
        model.save_pretrained(d, max_shard_size="200KB")
        paths.append(d)
        tokens = torch.randint(0, 1000, (2, 16), generator=g)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return transformers, paths


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_transformers_save_pretrained(hf, tmp_path, llama_saves, encoding):
    transformers, saves = llama_saves
    shards = [f for f in os.listdir(saves[0]) if f.endswith(".safetensors")]
    assert len(shards) > 1 and os.path.exists(os.path.join(saves[0], "model.safetensors.index.json"))
    root = tmp_path / "root"
    root.mkdir()
    hf.diff(saves[0], saves[1], str(root / "weight_v000001"), encoding)
    hf.diff(saves[1], saves[2], str(root / "weight_v000002"), encoding)
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(str(root / "weight_v000001"), local)
    stio.assert_same_tree(local, saves[1])

    # The patched LOCAL loads like save 1 and computes the same logits.
    patched = _load(transformers, local)
    ref = _load(transformers, saves[1])
    sd_p, sd_r = patched.state_dict(), ref.state_dict()
    assert sorted(sd_p) == sorted(sd_r)
    for k in sd_r:
        assert torch.equal(sd_p[k], sd_r[k]), k
    # And tensor by tensor against the files of the save itself.
    for f in shards:
        saved = safetensors.torch.load_file(os.path.join(saves[1], f))
        for k, v in saved.items():
            assert torch.equal(sd_p[k], v), k
    tokens = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(patched(input_ids=tokens).logits, ref(input_ids=tokens).logits)

    # The optimizer step changed most weights; the delta still round-trips the next save.
    hf.apply("--root", str(root), local)
    stio.assert_same_tree(local, saves[2])


def test_transformers_with_reference_applier(hf, tmp_path, llama_saves):
    """The same saves through the reference publisher and applier, crossed."""
    import slime_ref

    transformers, saves = llama_saves
    root = tmp_path / "root"
    root.mkdir()
    slime_ref.publish(saves[0], saves[1], str(root / "weight_v000001"), 1, encoding="xor")
    hf.diff(saves[1], saves[2], str(root / "weight_v000002"), "overwrite")
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(str(root / "weight_v000001"), local)
    slime_ref.apply(str(root / "weight_v000002"), local)
    stio.assert_same_tree(local, saves[2])
    model = _load(transformers, local)
    assert sum(p.numel() for p in model.parameters()) > 100_000
