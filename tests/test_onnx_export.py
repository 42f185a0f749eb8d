"""nac-drive export --format onnx and OnnxPolicy: the exported policy gives torch's outputs
(to 1e-5) and actions on held-out frames, drives held-out tracks to torch's returns, keeps the
Top-K's tie order, and a file that is not such a policy is refused in one line.

The onnx extra (onnx, onnxscript, onnxruntime) is in ``all``, which CI installs."""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from nac_drive.policy.loading import load_driving_policy  # noqa: E402
from support.held_out_drive import drive_recording, replay  # noqa: E402
from nac_drive.cli.main import main  # noqa: E402
from nac_drive.nac.selection import Visibility, select_exact  # noqa: E402
from nac_drive.policy.onnx_export import export_onnx  # noqa: E402
from nac_drive.policy.onnx_policy import FORMAT, META_CONFIG, META_FORMAT, META_GRAPH, OnnxPolicy  # noqa: E402
from nac_drive.policy.tasks import DISCRETE_GAS  # noqa: E402

HELD_OUT = 900000
FRAMES = 250   # held-out frames per parity check (benchmarks/onnx_policy.py measures 1,000)


def one_line_error(capsys, *argv, code=2) -> str:
    assert main([str(a) for a in argv]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def shipped():
    return load_driving_policy()


@pytest.fixture(scope="module")
def exported(shipped, tmp_path_factory):
    """The shipped policy exported as both graphs: {graph: path}."""
    folder = tmp_path_factory.mktemp("onnx")
    paths = {}
    for graph in ("step", "window"):
        result = export_onnx(shipped, folder / f"{graph}.onnx", graph=graph)
        assert result["max_abs_diff"] <= 1e-5, result
        paths[graph] = folder / f"{graph}.onnx"
    return paths


@pytest.fixture(scope="module")
def held_out(shipped):
    """The torch policy drives held-out track 900000: its frames and the head's outputs."""
    return drive_recording(shipped, [HELD_OUT], max_steps=FRAMES)


@pytest.mark.parametrize("graph", ["step", "window"])
def test_the_exported_policy_gives_torchs_outputs_and_actions_on_held_out_frames(exported, held_out, graph):
    policy = OnnxPolicy(exported[graph])
    assert policy.graph == graph and policy.config.core.window == 16
    got, expected = replay(policy, held_out), held_out.outputs
    assert got.shape == expected.shape == (FRAMES, 5)
    assert np.abs(got - expected).max() <= 1e-5
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert len(set(expected.argmax(1))) > 1   # the frames ask for more than one action


def test_the_window_graph_takes_any_length_up_to_the_window(exported, shipped, held_out):
    frames = torch.from_numpy(held_out.frames[:16]).permute(0, 3, 1, 2)[None]   # [1, 16, 3, 96, 96]
    t = torch.arange(16, dtype=torch.float32)[None] * shipped.config.frame_dt
    run = ort.InferenceSession(str(exported["window"]), providers=["CPUExecutionProvider"])
    for n in (1, 7, 16):
        with torch.no_grad():
            expected = shipped(frames[:, :n], t[:, :n]).numpy()
        got = run.run(None, {"frames": frames[:, :n].numpy(), "t": t[:, :n].numpy()})[0]
        assert got.shape == (1, n, 5) and np.abs(got - expected).max() <= 1e-5


def test_the_file_alone_holds_the_policy_config(exported, shipped):
    meta = {p.key: p.value for p in onnx.load(str(exported["step"])).metadata_props}
    assert meta[META_FORMAT] == FORMAT and meta[META_GRAPH] == "step"
    config = json.loads(meta[META_CONFIG])
    assert config["task"] == "carracing" and config["core"]["window"] == 16 and config["frame_dt"] == 0.02


@pytest.mark.slow
def test_drive_with_the_onnx_policy_scores_the_torch_policys_returns(exported, capsys):
    def drive(*policy):
        assert main(["drive", "carracing", *policy, "--episodes", "2", "--max-steps", "300", "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    torch_run, onnx_run = drive(), drive("--policy", str(exported["step"]))
    assert onnx_run["returns"] == torch_run["returns"] and onnx_run["seeds"] == [HELD_OUT, HELD_OUT + 1]


def test_export_verb_writes_a_file_drive_can_load(tmp_path, capsys):
    out = tmp_path / "policy.onnx"
    assert main(["export", "--format", "onnx", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["graph"] == "step" and result["max_abs_diff"] <= 1e-5
    assert OnnxPolicy(out).config.task == "carracing"


def test_exportable_topk_keeps_the_newest_among_equal_scores(tmp_path):
    """ONNX has no stable sort: the exported Top-K (topk, ties by index after the newest-first
    reordering) must pick the keys the eager reference picks, in its order, among many ties."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 2, (2, 3, 12, 4), generator=gen).float()   # 0/1 entries: scores 0..4, many equal
    k = torch.randint(0, 2, (2, 3, 12, 4), generator=gen).float()

    class Select(torch.nn.Module):
        def forward(self, q, k):
            return select_exact(q, k, 5, Visibility(causal=True, window=9))

    expected = Select()(q, k)
    scores = q @ k.transpose(-1, -2)
    last = scores[0, 0, 11, 3:12]   # the last query's visible keys: ties among them
    assert len(set(last.tolist())) < len(last)
    # the reference itself: among equal scores, the newer key first
    best = scores.gather(-1, expected.clamp(min=0))
    newer_first = (best[..., :-1] > best[..., 1:]) | (expected[..., :-1] > expected[..., 1:]) | (expected[..., 1:] < 0)
    assert newer_first.all()
    program = torch.onnx.export(Select().eval(), (q, k), dynamo=True, input_names=["q", "k"], output_names=["idx"])
    program.save(str(tmp_path / "select.onnx"))
    got = ort.InferenceSession(str(tmp_path / "select.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"q": q.numpy(), "k": k.numpy()})[0]
    np.testing.assert_array_equal(got, expected.numpy())


def tiny_model(path, inputs=(("x", [1, 4]),), meta=None):
    """A valid ONNX model (Identity of its first input) with ``meta`` as metadata_props."""
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, inputs[0][1])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", [inputs[0][0]], ["y"])], "g", ins, [out]),
                              opset_imports=[helper.make_opsetid("", 20)])
    helper.set_model_props(model, meta or {})
    onnx.save(model, str(path))
    return path


def test_a_file_that_is_not_an_exported_policy_is_refused_in_one_line(tmp_path, capsys, exported):
    config = json.dumps(asdict(load_driving_policy().config))
    text = tmp_path / "text.onnx"
    text.write_text("not a model")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(exported["step"].read_bytes()[:2000])
    cases = {
        text: "not an ONNX model onnxruntime can load",
        truncated: "not an ONNX model onnxruntime can load",
        tiny_model(tmp_path / "plain.onnx"): "not a policy exported by nac-drive export",
        tiny_model(tmp_path / "inputs.onnx", meta={META_FORMAT: FORMAT, META_GRAPH: "step", META_CONFIG: config}):
            "are not those of a step graph",
        tiny_model(tmp_path / "config.onnx", meta={META_FORMAT: FORMAT, META_GRAPH: "step", META_CONFIG: "{"}):
            f"metadata {META_CONFIG}",
        tiny_model(tmp_path / "graph.onnx", meta={META_FORMAT: FORMAT, META_GRAPH: "scan", META_CONFIG: config}):
            f"metadata {META_GRAPH} must be one of",
        tmp_path / "missing.onnx": "missing.onnx",
    }
    for path, why in cases.items():
        assert why in one_line_error(capsys, "drive", "carracing", "--policy", path, "--episodes", "1"), path


def test_an_upper_case_onnx_suffix_names_an_onnx_file_not_a_checkpoint_folder(tmp_path, capsys):
    from nac_drive.cli.commands.export import ExportArgs

    text = tmp_path / "text.ONNX"
    text.write_text("not a model")
    assert "not an ONNX model onnxruntime can load" in one_line_error(
        capsys, "drive", "carracing", "--policy", text, "--episodes", "1")
    assert ExportArgs(out=str(tmp_path / "policy.ONNX")).out.endswith(".ONNX")   # not refused as another format


def test_a_folder_where_an_onnx_file_is_expected_is_named_as_a_folder(tmp_path, capsys):
    folder = tmp_path / "policy.onnx"
    folder.mkdir()
    assert one_line_error(capsys, "drive", "carracing", "--policy", folder, "--episodes", "1").endswith(
        f"{folder}: not a regular file (a folder)")   # not "Is a directory: 6", a descriptor's number


def test_what_cannot_be_exported_or_done_with_an_onnx_policy_is_refused_in_one_line(tmp_path, capsys, exported):
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    mha = tmp_path / "mha"
    DrivingPolicy(PolicyConfig(core=CoreConfig(core="mha", window=4))).save_pretrained(mha)
    assert "export --graph window" in one_line_error(capsys, "export", "--policy", mha, tmp_path / "m.onnx")
    assert "ending in .onnx" in one_line_error(capsys, "export", tmp_path / "policy.pt")
    assert not (tmp_path / "m.onnx").exists()
    step = exported["step"]
    assert "--trace and --rerun need its checkpoint folder" in one_line_error(
        capsys, "drive", "carracing", "--policy", step, "--episodes", "1", "--trace", tmp_path / "run")
    assert not (tmp_path / "run").exists()   # refused before the run folder is made
    assert "only drives" in one_line_error(capsys, "saliency", tmp_path, "--policy", step)


def with_weight(source, path, name, value):
    """A copy of the exported file at ``source`` with the first entry of initializer ``name`` set to ``value``."""
    from onnx import numpy_helper

    model = onnx.load(str(source))
    tensor = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(tensor).copy()
    array.flat[0] = value
    tensor.CopyFrom(numpy_helper.from_array(array, name))
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_an_onnx_file_with_a_non_finite_weight_is_refused_in_one_line(tmp_path, capsys, exported, value):
    """Such a file once drove every frame as noop (NaN logits); the same weights in safetensors are refused."""
    for graph in ("step", "window"):
        bad = with_weight(exported[graph], tmp_path / f"{graph}.onnx", "policy.head.1.bias", value)
        line = one_line_error(capsys, "drive", "carracing", "--policy", bad, "--episodes", "1")
        assert "policy.head.1.bias contains NaN or inf" in line, line
    OnnxPolicy(exported["step"])   # the exporter's own -inf and float32-lowest fills are scalars, not refused


def with_nodes(source, path, nodes, initializers):
    """A copy of the exported file at ``source`` with ``nodes`` (and their ``initializers``) added."""
    model = onnx.load(str(source))
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(initializers)
    onnx.save(model, str(path))
    return path


def hostile_loop():
    """A Loop of 10^12 iterations (a hostile file: it once hung the first frame)."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Identity", ["v_in"], ["v_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])])
    start = [numpy_helper.from_array(np.array(10**12, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "keep_going"), numpy_helper.from_array(np.float32(0), "v0")]
    return [helper.make_node("Loop", ["trips", "keep_going", "v0"], ["v_final"], body=body)], start


def hostile_fill():
    """A ConstantOfShape asking for 10^13 floats, 40 TB (it once exited 1 "a bug" at the first frame)."""
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([10**7, 10**6], np.int64), "huge_shape")
    return [helper.make_node("ConstantOfShape", ["huge_shape"], ["huge"])], [shape]


@pytest.mark.parametrize("hostile, why", [(hostile_loop, "its graph has Loop (control flow"),
                                          (hostile_fill, "huge would hold 10,000,000,000,000 values")])
def test_an_onnx_graph_of_unbounded_work_is_refused_at_load_in_one_line(tmp_path, capsys, exported, hostile, why):
    for graph in ("step", "window"):
        bad = with_nodes(exported[graph], tmp_path / f"{graph}.onnx", *hostile())
        line = one_line_error(capsys, "drive", "carracing", "--policy", bad, "--episodes", "1")
        assert why in line, line


def with_config(source, path, **changes):
    """A copy of the exported file at ``source`` whose embedded config has ``changes``."""
    model = onnx.load(str(source))
    entry = next(e for e in model.metadata_props if e.key == META_CONFIG)
    entry.value = json.dumps({**json.loads(entry.value), **changes})
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("changes", [{"action": "continuous", "num_outputs": 3}, {"num_outputs": 7}])
def test_an_onnx_file_whose_config_disagrees_with_its_heads_width_is_refused_in_one_line(
        tmp_path, capsys, exported, changes):
    """Config continuous/3 on the 5-logit graph once drove returning 5 values against Box(3,); a
    config of 7 failed mid-drive "a bug"."""
    if changes.get("action") == "continuous":   # a continuous policy has no GAS of its own
        changes = {**changes, "gas": DISCRETE_GAS}
    for graph in ("step", "window"):
        bad = with_config(exported[graph], tmp_path / f"{graph}.onnx", **changes)
        line = one_line_error(capsys, "drive", "carracing", "--policy", bad, "--episodes", "1")
        assert f"are not those of a {graph} graph of this policy's config ({changes['num_outputs']} outputs)" in line


def test_a_core_that_loops_over_its_frames_is_refused_before_any_export_work(tmp_path, capsys, monkeypatch):
    """An lstm, gru, cfc or ltc window graph was unrolled at one length: export failed after its
    work, "unexpected Fail: Reshape", and left a .onnx that failed on its first frame."""
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    def no_export(*args, **kwargs):
        raise AssertionError("the exporter ran")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    for core in ("lstm", "gru", "cfc", "ltc"):
        folder = tmp_path / core
        DrivingPolicy(PolicyConfig(core=CoreConfig(core=core, window=4))).save_pretrained(folder)
        for graph in ("window", "step"):
            line = one_line_error(capsys, "export", "--policy", folder, "--graph", graph, tmp_path / "out.onnx")
            assert f"core: a {core!r} core steps its frames in a Python loop" in line and "only nac and mha" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfc", "gru", "lstm", "ltc"]


def test_an_output_that_cannot_be_written_is_refused_before_any_export_work(tmp_path, capsys, monkeypatch):
    """export once found out only after 10-40 s of exporting, naming its hidden temporary file."""
    def no_export(*args, **kwargs):
        raise AssertionError("the exporter ran")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder must go")
    line = one_line_error(capsys, "export", blocker / "out.onnx")
    assert f"{blocker}: cannot write there" in line and ".tmp" not in line, line
    (tmp_path / "taken.onnx").mkdir()
    line = one_line_error(capsys, "export", tmp_path / "taken.onnx")
    assert "is a folder; the output is a file of that name" in line, line


def test_an_export_that_fails_its_check_leaves_no_file(tmp_path, capsys, monkeypatch):
    """The file takes its name only after OnnxPolicy loads it and onnxruntime runs it; a failure
    removes it, and the one line names the output, never the hidden temporary file."""
    from nac_drive.policy import onnx_export
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    folder = tmp_path / "mha"
    DrivingPolicy(PolicyConfig(core=CoreConfig(core="mha", window=4))).save_pretrained(folder)

    def fails(policy, path, graph):
        raise RuntimeError(f"[ONNXRuntimeError] Reshape failed in {path}")

    monkeypatch.setattr(onnx_export, "max_abs_diff", fails)
    out = tmp_path / "out.onnx"
    line = one_line_error(capsys, "export", "--policy", folder, "--graph", "window", out)
    assert f"{out}: the exported window graph does not run on onnxruntime (" in line and ".tmp" not in line
    assert "Reshape failed in the file" in line and "nothing was written" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mha"]


def test_onnx_metadata_nested_100k_deep_is_refused_in_one_line(tmp_path, capsys, exported):
    """The config in the file's metadata, 100,000 levels deep: once RecursionError, "a bug"."""
    model = onnx.load(str(exported["step"]))
    next(e for e in model.metadata_props if e.key == META_CONFIG).value = "[" * 100_000 + "]" * 100_000
    onnx.save(model, str(tmp_path / "deep.onnx"))
    line = one_line_error(capsys, "drive", "carracing", "--policy", tmp_path / "deep.onnx", "--episodes", "1")
    assert f"metadata {META_CONFIG}: JSON nested deeper than 64 levels" in line
