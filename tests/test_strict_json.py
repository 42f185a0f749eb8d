"""What the package writes as JSON (reports and every verb's --json line) is strict JSON, and what it
reads is bounded in depth."""

import json

import numpy as np
import pytest

from nac_drive.cli.arguments import JsonOutput
from nac_drive.io.strict_json import dumps, write_report


def strict(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_become_null_and_numpy_values_python_numbers(tmp_path):
    value = {"nan": float("nan"), "inf": np.float32("inf"), "counts": np.arange(3), 7: np.int64(2),
             "flag": np.bool_(True), "nested": [(np.float64(-np.inf), 0.5)]}
    expected = {"nan": None, "inf": None, "counts": [0, 1, 2], "7": 2, "flag": True, "nested": [[None, 0.5]]}
    assert strict(dumps(value)) == expected
    assert strict(write_report(tmp_path / "r.json", value).read_text()) == expected
    with pytest.raises(ValueError):   # what json.dumps alone would have printed
        strict(json.dumps({"nan": float("nan")}))


def test_the_json_line_is_printed_only_when_asked_and_is_strict(capsys):
    JsonOutput(json=False).emit({"mean_return": 1.0})
    assert capsys.readouterr().out == ""
    JsonOutput(json=True).emit({"mean_return": float("nan"), "seeds": np.array([900000])})
    line = capsys.readouterr().out
    assert line.endswith("\n") and line.count("\n") == 1
    assert strict(line) == {"mean_return": None, "seeds": [900000]}


def test_the_depth_bound_counts_brackets_outside_strings_only():
    from nac_drive.io.bounded_json import MAX_DEPTH, loads, within_depth

    nested = lambda n: "[" * n + "]" * n   # noqa: E731
    assert within_depth(nested(MAX_DEPTH)) and not within_depth(nested(MAX_DEPTH + 1))
    in_a_string = json.dumps({"image": "[{" * 500, "steering": [[1]]})   # 1000 brackets, 3 deep
    assert within_depth(in_a_string) and loads(in_a_string)["steering"] == [[1]]
    with pytest.raises(ValueError, match=f"deeper than {MAX_DEPTH}"):
        loads(nested(100_000))
