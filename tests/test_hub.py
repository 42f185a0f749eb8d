"""DrivingPolicy on the Hugging Face Hub (huggingface_hub's PyTorchModelHubMixin), offline:
the Hub is faked behind the library's HTTP client (support.fake_hub) or laid out as its
cache folder; the library's own download and upload code runs."""

import json
import time
from dataclasses import asdict

import pytest
import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin, constants
from support.fake_hub import FakeHub, serve, unreachable

from nac_drive.io.checkpoint import CheckpointError
from nac_drive.cli import main
from nac_drive.policy.cores import CoreConfig
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

torch.set_num_threads(1)
CARD = {"data": "demos/carracing-teacher.h5", "held_out_score": 812.5}


def tiny_policy(**kw) -> DrivingPolicy:
    return DrivingPolicy(PolicyConfig(core=CoreConfig(core="nac", window=6, d_model=16, num_heads=2, topk=3,
                                                      seed=3), **kw)).eval()


def same_outputs(a: DrivingPolicy, b: DrivingPolicy) -> bool:
    x = torch.randint(0, 256, (2, 5, 3, 96, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return torch.equal(a(x), b(x))


def checkpoint_files(policy: DrivingPolicy, tmp_path, **card) -> dict[str, bytes]:
    folder = policy.save_pretrained(tmp_path / "saved", model_card_kwargs=card or None)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_save_pretrained_writes_the_checkpoint_and_a_card_and_loads_back_equal(tmp_path):
    policy = tiny_policy()
    folder = policy.save_pretrained(tmp_path / "ckpt", model_card_kwargs=CARD)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert json.loads((folder / "config.json").read_text()) == asdict(policy.config)   # today's format
    loaded = DrivingPolicy.from_pretrained(folder)
    assert loaded.config == policy.config and not loaded.training
    assert same_outputs(loaded, policy) and not same_outputs(loaded, tiny_policy(head_dropout=0.1).train())

    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "nac-drive" and {"carracing", "nac"} <= set(card.data.tags)
    result = card.data.eval_results[0]
    assert (result.dataset_type, result.metric_value) == ("CarRacing-v3", 812.5)
    for shown in ("| task | `carracing`", "window 6, d_model 16, 2 heads", "| data | demos/carracing-teacher.h5",
                  "| held-out score | 812.5 (mean episode return"):
        assert shown in card.text
    bare = ModelCard.load(tiny_policy().save_pretrained(tmp_path / "bare") / "README.md")
    assert bare.data.eval_results is None and "| held-out score | not measured" in bare.text
    with pytest.raises(ValueError, match="unknown keys \\['held_out'\\]"):
        policy.save_pretrained(tmp_path / "typo", model_card_kwargs={"held_out": 1.0})


def test_push_to_hub_uploads_checkpoint_and_card_and_a_hub_id_loads_it(tmp_path):
    policy, hub = tiny_policy(), FakeHub()
    with serve(hub):
        url = policy.push_to_hub("someone/tiny-nac", token="hf_test", model_card_kwargs=CARD)
        assert hub.created == ["someone/tiny-nac"] and url.endswith(hub.main["someone/tiny-nac"])
        uploaded = hub.files("someone/tiny-nac")
        assert uploaded == checkpoint_files(policy, tmp_path, **CARD, repo_id="someone/tiny-nac")
        assert set(uploaded) == {"README.md", "config.json", "model.safetensors"}
        assert 'DrivingPolicy.from_pretrained("someone/tiny-nac")' in uploaded["README.md"].decode()

        loaded = DrivingPolicy.from_pretrained("someone/tiny-nac", cache_dir=tmp_path / "cache")
        url = policy.save_pretrained(tmp_path / "also", push_to_hub=True, repo_id="someone/also", token="hf_test")
        also = hub.files("someone/also")
        assert url.endswith(hub.main["someone/also"]) and also["model.safetensors"] == uploaded["model.safetensors"]
        assert 'from_pretrained("someone/also")' in also["README.md"].decode()
    assert same_outputs(loaded, policy)
    sha = hub.main["someone/tiny-nac"]
    assert ("GET", "/someone/tiny-nac/resolve/main/config.json") in hub.requests
    assert ("GET", f"/someone/tiny-nac/resolve/{sha}/model.safetensors") in hub.requests   # same commit
    snapshot = tmp_path / "cache" / "models--someone--tiny-nac" / "snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors"]


def test_the_mixins_own_from_pretrained_ends_in_the_checked_loader(tmp_path):
    folder = tiny_policy().save_pretrained(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "surprise": 1}))
    with pytest.raises(CheckpointError, match="surprise"):
        PyTorchModelHubMixin.from_pretrained.__func__(DrivingPolicy, folder)


def lay_out_cache(cache, repo: str, files: dict[str, bytes], revision: str = "a" * 40) -> None:
    """The huggingface_hub cache layout: refs/main names a snapshot folder of the files."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(revision)
    (root / "snapshots" / revision).mkdir(parents=True)
    for name, data in files.items():
        (root / "snapshots" / revision / name).write_bytes(data)


def test_a_hub_id_loads_from_the_offline_cache_without_a_request(tmp_path, monkeypatch):
    policy, hub = tiny_policy(action="continuous", num_outputs=3), FakeHub()
    lay_out_cache(tmp_path / "cache", "owner/driver", checkpoint_files(policy, tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with serve(hub):
        loaded = DrivingPolicy.from_pretrained("owner/driver")
        with pytest.raises(CheckpointError, match="owner/missing: .*config.json"):
            DrivingPolicy.from_pretrained("owner/missing")
    assert same_outputs(loaded, policy) and hub.requests == []


def test_a_missing_hub_repo_or_file_is_one_clear_line(tmp_path, capsys, monkeypatch):
    hub = FakeHub()
    hub.add_commit("owner/weightless", {"config.json": json.dumps(asdict(tiny_policy().config)).encode()})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with serve(hub):
        with pytest.raises(CheckpointError, match="nobody/nothing: no checkpoint folder .*RepositoryNotFound"):
            DrivingPolicy.from_pretrained("nobody/nothing")
        with pytest.raises(CheckpointError, match="owner/weightless: .*model.safetensors .*EntryNotFound"):
            DrivingPolicy.from_pretrained("owner/weightless")
        assert main(["drive", "carracing", "--policy", "nobody/nothing", "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nobody/nothing" in err[0]
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):   # a bare name is a folder
        DrivingPolicy.from_pretrained("nothing")
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with serve(hub):   # so is owner/name when a folder named like the owner is here: no Hub request
        with pytest.raises(CheckpointError, match="runs/typo: not a checkpoint folder"):
            DrivingPolicy.from_pretrained("runs/typo")
    assert not any("typo" in path for _, path in hub.requests)


def test_an_unreachable_hub_fails_at_once_in_one_line_naming_the_ways_out(tmp_path, capsys, monkeypatch):
    # hf_hub_download alone retries for ~25 s without a network: one request, then the answer
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with unreachable() as tried:
        started = time.monotonic()
        with pytest.raises(CheckpointError, match="owner/driver: .*Hub cannot be reached .*ConnectError") as e:
            DrivingPolicy.from_pretrained("owner/driver")
        assert time.monotonic() - started < 3 and len(tried) == 1
        assert "local checkpoint folder" in str(e.value) and "HF_HUB_OFFLINE=1" in str(e.value)
        assert main(["drive", "carracing", "--policy", "owner/driver", "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HF_HUB_OFFLINE=1" in err[0]


def test_an_unreachable_hub_still_loads_a_cached_copy(tmp_path, monkeypatch):
    policy = tiny_policy(action="continuous", num_outputs=3)
    lay_out_cache(tmp_path / "cache", "owner/driver", checkpoint_files(policy, tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with unreachable() as tried:
        loaded = DrivingPolicy.from_pretrained("owner/driver")
    assert same_outputs(loaded, policy) and len(tried) == 1
