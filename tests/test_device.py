"""``--device auto|cpu|cuda[:N]|mps`` (issue 55 item 1): its syntax, its resolution, the verbs
that take it, a device this machine lacks refused in one line before any work, and the
plumbing: training's parameters and batches, a closed-loop step's inputs, and the NAC layer's
numba kernels, which serve CPU tensors only. The machine has no GPU: the plumbing is checked
on PyTorch's "meta" device, which no code path moves a tensor to unless told."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from support.cli_parsers import verb_parsers

from nac_drive.devices import device_problem, module_device, resolve_device

# the verbs that run a network, each with the arguments it needs to reach its device check
DEVICE_VERBS = {
    "nac-drive train": ["train"],
    "nac-drive dagger": ["dagger", "--policy", "/nonexistent/policy"],
    "nac-drive compare": ["compare", "--data", "/nonexistent/demos"],
    "nac-drive tune": ["tune", "--data", "/nonexistent/demos"],
    "nac-drive drive carracing": ["drive", "carracing"],
    "nac-drive drive udacity": ["drive", "udacity"],
    "nac-drive expert train": ["expert", "train"],
    "nac-drive expert kickstart": ["expert", "kickstart"],
    "nac-drive expert eval": ["expert", "eval"],
    "nac-drive expert compare": ["expert", "compare", "/nonexistent/expert.zip"],
    "nac-drive explain": ["explain"],
    "nac-drive saliency": ["saliency", "/nonexistent/run"],
    "nac-drive export": ["export", "policy.onnx"],
}
NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12", "mps"])
def test_the_device_syntax_takes_the_five_forms(spec):
    assert device_problem(spec) is None


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "cpu:0", " cpu", "", None])
def test_the_device_syntax_refuses_anything_else(spec):
    assert "expected auto, cpu, cuda, cuda:N or mps" in device_problem(spec)
    with pytest.raises(ValueError, match="^--device: expected"):
        resolve_device(spec)


def test_auto_takes_cuda_then_mps_then_the_cpu(monkeypatch):
    import nac_drive.devices as devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_an_absent_device_or_gpu_index_is_refused_in_one_line(monkeypatch):
    import nac_drive.devices as devices

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    for spec, why in (("cuda", "torch sees no CUDA GPU"), ("cuda:1", "torch sees no CUDA GPU"),
                      ("mps", "no MPS")):
        with pytest.raises(ValueError, match=f"^--device {spec}: .*{why}") as error:
            resolve_device(spec)
        assert "\n" not in str(error.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"^--device cuda:2: torch sees 2 CUDA GPU\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_exactly_the_verbs_that_run_a_network_take_device():
    taking = {name for name, parser in verb_parsers()
              if any("--device" in action.option_strings for action in parser._actions)}
    assert taking == set(DEVICE_VERBS)
    for name, parser in verb_parsers():
        if name in DEVICE_VERBS:
            assert "--device DEVICE" in parser.format_help(), name


def test_a_bad_device_is_refused_when_the_flags_are_parsed():
    from nac_drive.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--device", "gpu"])
    assert exit_.value.code == 2


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a GPU: --device cuda would run")
@pytest.mark.parametrize("verb", list(DEVICE_VERBS))
def test_cuda_on_a_machine_without_one_is_one_line_and_exit_2_before_any_work(verb, tmp_path):
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", *DEVICE_VERBS[verb], "--device", "cuda"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"{verb.split()[0]} {verb.split()[1]}: error: --device cuda: torch sees no CUDA GPU")
    assert list(tmp_path.iterdir()) == []   # nothing written: no run folder, no study, no trace


class Reached(Exception):
    """Raised by a test's hook once it has seen what it checks."""


def test_train_puts_the_policy_and_every_batch_tensor_on_the_device(tmp_path, monkeypatch):
    """Resolved to "meta", training's parameters, frames, timestamps, targets and class
    weights must all be meta at the loss: a tensor left behind stays on the CPU."""
    from support.demos import synthetic_episodes

    import nac_drive.pipeline.train as training
    from nac_drive.data_collection.carracing_dataset import write_dataset
    from nac_drive.pipeline.train_args import TrainArgs
    from nac_drive.policy.driving_policy import DrivingPolicy

    demos = tmp_path / "demos"
    write_dataset(demos, "synthetic", synthetic_episodes(2, 12), "CarRacing-v3", expert="bands", description="test")
    asked = []
    monkeypatch.setattr(training, "resolve_device", lambda spec: asked.append(spec) or torch.device("meta"))
    seen = {}
    forward = DrivingPolicy.forward

    def recording_forward(policy, frames, t=None, return_trace=False):
        seen.update(frames=frames.device, stamps=t.device, parameters={p.device for p in policy.parameters()})
        return forward(policy, frames, t, return_trace)

    def recording_loss(outputs, target, weights):
        seen.update(outputs=outputs.device, target=target.device, weights=weights.device)
        raise Reached

    monkeypatch.setattr(DrivingPolicy, "forward", recording_forward)
    monkeypatch.setattr(training, "bc_loss", recording_loss)
    args = TrainArgs(data=str(demos), out=str(tmp_path / "runs"), core="lstm", window=4, d_model=8, epochs=1,
                     windows_per_epoch=8, batch_size=8, val_fraction=0.5, class_weighting="balanced",
                     progress=False, device="cuda:3")
    with pytest.raises(Reached):
        training.train(args, threads=1)
    meta = torch.device("meta")
    assert asked == ["cuda:3"]
    assert seen == dict(frames=meta, stamps=meta, parameters={meta}, outputs=meta, target=meta, weights=meta)


def test_a_closed_loop_step_takes_its_inputs_to_the_policy_device(monkeypatch):
    """A policy moved to "meta" must see its frame and its time there (the encoder and the
    core run on the policy's device; only the output comes back to the CPU)."""
    from nac_drive.policy.loading import load_driving_policy

    policy = load_driving_policy()
    assert {p.device.type for p in policy.parameters()} == {"cpu"}   # the default: the CPU
    policy.to("meta").reset()
    seen = {}
    policy.encoder.register_forward_hook(lambda module, inputs, output: seen.update(frame=inputs[0].device))

    def recording_step(x_t, state, t=None, return_trace=False):
        seen.update(features=x_t.device, time=t.device)
        raise Reached

    monkeypatch.setattr(policy.core, "step", recording_step)
    with pytest.raises(Reached):
        policy.select_action(torch.zeros(96, 96, 3, dtype=torch.uint8).numpy())
    assert seen == {"frame": torch.device("meta"), "features": torch.device("meta"), "time": torch.device("meta")}


def test_load_driving_policy_puts_the_policy_on_the_asked_device(monkeypatch):
    import nac_drive.devices as devices
    from nac_drive.policy.loading import load_driving_policy

    monkeypatch.setattr(devices, "resolve_device", lambda spec: torch.device("meta"))
    assert {p.device.type for p in load_driving_policy(device="cuda").parameters()} == {"meta"}


def test_the_numba_kernels_serve_cpu_tensors_only():
    """kernels.choose hands the fast path CPU tensors only: on another device the eager torch
    code runs (meta stands in for a GPU; the same tensors on the CPU do take the kernels)."""
    from nac_drive.nac import kernels

    if not kernels.available():
        pytest.skip("numba kernels unavailable here")
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    assert kernels.handles_selection(q, k)
    assert kernels.choose(q.to("meta"), k.to("meta"), q.to("meta"), k.to("meta"), None, True) \
        == kernels.Backend(False, False)
    assert not kernels.handles_pairs(q.to("meta"), k.to("meta"), (k.to("meta"),))
    assert kernels.handles_pairs(q, k, (k,))


def test_the_ppo_expert_is_made_on_the_asked_device(monkeypatch):
    """expert kickstart's PPO model takes the device the flag resolves to, not a fixed "cpu"."""
    import stable_baselines3

    import nac_drive.agents.ppo_lab.kickstart as kickstart

    made = {}

    def recording_ppo(*args, **kwargs):
        made.update(kwargs)
        raise Reached

    monkeypatch.setattr(kickstart, "resolve_device", lambda spec: f"resolved {spec}")
    monkeypatch.setattr(stable_baselines3, "PPO", recording_ppo)
    with pytest.raises(Reached):
        kickstart.new_model(kickstart.KickstartArgs(device="cuda:1"))
    assert made["device"] == "resolved cuda:1"


def on_meta(monkeypatch) -> list:
    """Every --device resolves to "meta" (through nac_drive.devices); the specs asked, in order."""
    import nac_drive.devices as devices

    asked = []
    monkeypatch.setattr(devices, "resolve_device", lambda spec: asked.append(spec) or torch.device("meta"))
    return asked


def test_saliency_computes_its_maps_with_the_policy_on_the_device(monkeypatch):
    import nac_drive.interpret.policy_saliency as policy_saliency
    from nac_drive.cli.main import main

    asked, seen = on_meta(monkeypatch), {}

    def recording(policy, run, method):
        seen.update(parameters={p.device.type for p in policy.parameters()}, run=run)
        raise Reached

    monkeypatch.setattr(policy_saliency, "policy_saliency", recording)
    monkeypatch.setenv("NAC_DRIVE_TRACEBACK", "1")
    with pytest.raises(Reached):
        main(["saliency", "runs/x", "--device", "cuda:1"])
    assert asked == ["cuda:1"] and seen == {"parameters": {"meta"}, "run": "runs/x"}


def test_a_frame_model_gives_its_outputs_on_the_frames_device():
    """Attribution methods build their inputs on the CPU: the frame model (Grad-CAM's and
    captum's model) takes them to the policy's device and its outputs back (here both the CPU,
    and the output still differentiable through the move)."""
    from nac_drive.policy.loading import load_driving_policy

    policy = load_driving_policy()
    frames = torch.rand(2, 3, 96, 96, requires_grad=True)
    out = policy.frame_model()(frames)
    assert out.device == frames.device and out.shape == (2, 5)
    out.sum().backward()
    assert frames.grad is not None and frames.grad.abs().sum() > 0


def test_export_traces_a_cpu_copy_and_checks_it_on_the_device(tmp_path, monkeypatch):
    """export --device D: onnxruntime's file is traced from the policy on the CPU, and the torch
    outputs it is checked against are computed by a copy of the policy on D."""
    pytest.importorskip("onnxscript")
    import nac_drive.policy.onnx_export as onnx_export
    from nac_drive.cli.main import main

    asked, moved, traced = [], [], {}
    monkeypatch.setattr(onnx_export, "resolve_device", lambda spec: asked.append(spec) or torch.device("meta"))
    real_on = onnx_export._on

    def recording_on(policy, device):
        copy = real_on(policy, device)
        moved.append((device.type, {p.device.type for p in copy.parameters()}))
        return copy

    def recording_export(module, args, **kwargs):
        traced.update(parameters={p.device.type for p in module.parameters()}, inputs={a.device.type for a in args})
        raise Reached

    monkeypatch.setattr(onnx_export, "_on", recording_on)
    monkeypatch.setattr(torch.onnx, "export", recording_export)
    monkeypatch.setenv("NAC_DRIVE_TRACEBACK", "1")
    with pytest.raises(Reached):
        main(["export", str(tmp_path / "policy.onnx"), "--device", "cuda"])
    assert asked == ["cuda"]
    assert moved == [("meta", {"meta"}), ("cpu", {"cpu"})]   # the reference on the device, the trace on the CPU
    assert traced == {"parameters": {"cpu"}, "inputs": {"cpu"}}


def test_expert_eval_runs_the_ppo_experts_network_on_the_device(monkeypatch):
    from nac_drive.agents.experts import load_expert

    asked, seen = on_meta(monkeypatch), {}
    expert, _ = load_expert("ppo", device="cuda")
    assert asked == ["cuda"] and {p.device.type for p in expert.policy.parameters()} == {"meta"}

    def recording(x):
        seen["frames"] = x.device.type
        raise Reached

    monkeypatch.setattr(expert.policy, "get_distribution", recording)
    with pytest.raises(Reached):
        expert.act(np.zeros((96, 96, 3), dtype=np.uint8))
    assert seen == {"frames": "meta"}


def test_expert_eval_refuses_device_for_an_expert_that_runs_no_network(capsys):
    from nac_drive.cli.main import main

    assert main(["expert", "eval", "--expert", "teacher", "--device", "cpu", "--episodes", "1"]) == 2
    assert "--device: teacher runs no network" in capsys.readouterr().err


def test_expert_compare_scores_each_zip_with_its_network_on_the_device(monkeypatch):
    from stable_baselines3.common.policies import ActorCriticCnnPolicy

    import nac_drive.agents.ppo_lab.training as training
    from nac_drive.agents.ppo_expert import shipped_expert_path

    seen = {}
    monkeypatch.setattr(training, "resolve_device", lambda spec: seen.update(asked=spec) or torch.device("meta"))

    def recording_predict(policy, obs, deterministic=False):
        seen["parameters"] = {p.device.type for p in policy.parameters()}
        raise Reached

    monkeypatch.setattr(ActorCriticCnnPolicy, "predict", recording_predict)
    with pytest.raises(Reached):
        training.score_checkpoint(shipped_expert_path(), 1, 70_000, device="cuda:2")
    assert seen == {"asked": "cuda:2", "parameters": {"meta"}}


def test_explain_loads_its_policy_and_drives_its_trace_on_the_device(tmp_path, monkeypatch):
    import nac_drive.pipeline.drive as drive
    import nac_drive.policy.loading as loading
    from nac_drive.pipeline.explain import ExplainArgs, explain

    asked, seen = on_meta(monkeypatch), {}
    real_load = loading.load_driving_policy

    def recording_load(*args, **kwargs):
        policy = real_load(*args, **kwargs)
        seen["parameters"] = {p.device.type for p in policy.parameters()}
        return policy

    def recording_drive(args, progress=True):
        seen["drive"] = args.device
        raise Reached

    monkeypatch.setattr(loading, "load_driving_policy", recording_load)
    monkeypatch.setattr(drive, "drive_carracing", recording_drive)
    with pytest.raises(Reached):
        explain(ExplainArgs(out=str(tmp_path / "explain"), device="cuda"), progress=False)
    assert asked == ["cuda"] and seen == {"parameters": {"meta"}, "drive": "cuda"}


def test_explains_replay_encodes_and_batches_the_run_on_the_policy_device(tmp_path):
    """The atlas's replay (its neurons silenced on the run's frames) keeps its features, times and
    mask where the policy is, so the core never meets a CPU tensor."""
    from support.steering_policy import record_policy_run, road_episodes

    from nac_drive.interpret.neuron_atlas import PolicyReplay
    from nac_drive.policy.loading import load_driving_policy

    policy = load_driving_policy()
    run = record_policy_run(policy, road_episodes(episodes=1, steps=6), tmp_path / "run")
    replay = PolicyReplay(policy.to("meta"), run)
    assert {replay.features.device.type, replay.times.device.type, replay.valid.device.type} == {"meta"}
    assert replay.features.shape == (1, 6, policy.config.feature_dim)


def test_module_device_is_the_first_parameters_device():
    """What ``next(module.parameters())`` gives (a module's own parameters first, then its
    children's in order), read without the generators; the CPU for a module without any."""
    meta, cpu = torch.nn.Linear(2, 2, device="meta"), torch.nn.Linear(2, 2)
    modules = [torch.nn.ReLU(), torch.nn.Sequential(torch.nn.ReLU(), meta, cpu), torch.nn.Sequential(cpu, meta),
               torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()), torch.nn.Sequential(meta))]
    owner = torch.nn.Module()
    owner.child, owner.weight = cpu, torch.nn.Parameter(torch.zeros(1, device="meta"))
    for module in [*modules, owner]:
        assert module_device(module) == next((p.device for p in module.parameters()), torch.device("cpu"))
    assert [module_device(m).type for m in [*modules, owner]] == ["cpu", "meta", "cpu", "meta", "meta"]
