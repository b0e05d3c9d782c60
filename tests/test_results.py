"""A cell's result files: every declared field, atomic writes, one JSON line per step."""

from __future__ import annotations

import json
import os

import pytest
from pretrain_planner.results import (
    RESULT_FIELDS,
    STATUSES,
    atomic_write_text,
    empty_result,
    read_result,
    write_result,
    write_steps,
)

TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _result(**extra):
    result = {
        "status": "ok",
        "model": "tiny-gptneox",
        "gpu": "cpu",
        "nodes": 1,
        "gpus_per_node": 2,
        "world_size": 2,
        "method": "fl+zero3+off",
        "precision": "bf16",
        "global_batch": 16,
        "micro_batch": 4,
        "grad_accum_steps": 2,
        "step_time_s": 0.125,
        "suspect": False,
        "method_settings": {"sharding": "zero3", "offload": True, "compile": [1, 2]},
        "micro_batch_trials": [{"micro_batch": 8, "fits": False}, {"micro_batch": 4, "fits": True}],
    }
    result.update(extra)
    return result


def test_declared_types_are_known():
    assert set(RESULT_FIELDS.values()) <= set(TYPES) | {"json"}
    assert "status" in RESULT_FIELDS and "reason" in RESULT_FIELDS


def test_each_status_is_written_and_read_and_no_other(tmp_path):
    """Every status a reader is told of is one a result can be written with and read back as usable; a status
    outside them is refused on writing and named as the problem on reading."""
    from pretrain_planner.results import REQUIRED, parse_result

    assert set(REQUIRED) == set(STATUSES)
    for status in STATUSES:
        path = tmp_path / f"{status}.json"
        write_result(path, _result(status=status))
        row, problem = parse_result(path)
        assert problem is None and row["status"] == status, (status, problem)
    with pytest.raises(ValueError, match="'failed' is not one of"):
        write_result(tmp_path / "x.json", _result(status="failed"))
    (tmp_path / "x.json").write_text(json.dumps({**empty_result(**_result()), "status": "failed"}))
    assert "status 'failed' is not one of" in parse_result(tmp_path / "x.json")[1]


def test_empty_result_has_every_field():
    r = empty_result(model="m", nodes=2)
    assert list(r) == list(RESULT_FIELDS)
    assert r["model"] == "m" and r["nodes"] == 2
    assert all(v is None for k, v in r.items() if k not in ("model", "nodes"))


def test_write_result_round_trips(tmp_path):
    path = tmp_path / "cells" / "tiny-gptneox" / "cpu" / "1x2" / "fl+zero3+off" / "result.json"
    original = _result()
    write_result(path, original)  # creates the folders
    back = read_result(path)
    assert list(back) == list(RESULT_FIELDS)  # every field, in declared order
    for key, value in original.items():
        assert back[key] == value, key
    assert all(back[k] is None for k in RESULT_FIELDS if k not in original)
    on_disk = json.loads(path.read_text())
    assert list(on_disk) == list(RESULT_FIELDS)  # the file itself holds every field
    for key, value in back.items():
        if value is not None and RESULT_FIELDS[key] in TYPES:
            assert isinstance(value, TYPES[RESULT_FIELDS[key]]), key
    assert original == _result()  # the caller's dict is not modified


def test_write_result_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "result.json"
    for i in range(3):
        write_result(path, _result(step_time_s=float(i)))
    assert os.listdir(tmp_path) == ["result.json"]
    assert read_result(path)["step_time_s"] == 2.0


@pytest.mark.parametrize("status", STATUSES)
def test_every_status_is_accepted(tmp_path, status):
    path = tmp_path / "result.json"
    write_result(path, {"status": status, "reason": "why"})
    assert read_result(path)["status"] == status


@pytest.mark.parametrize("bad", [None, "failed", "OK", ""])
def test_bad_status_is_rejected(tmp_path, bad):
    path = tmp_path / "result.json"
    with pytest.raises(ValueError, match="status"):
        write_result(path, _result(status=bad))
    assert not path.exists()
    assert os.listdir(tmp_path) == []


def test_missing_status_is_rejected(tmp_path):
    result = _result()
    del result["status"]
    with pytest.raises(ValueError, match="status"):
        write_result(tmp_path / "result.json", result)


def test_undeclared_fields_are_rejected(tmp_path):
    path = tmp_path / "result.json"
    with pytest.raises(ValueError, match=r"undeclared fields \['loss_curve', 'tokens_per_day'\]"):
        write_result(path, _result(tokens_per_day=1.0, loss_curve=[1, 2]))
    assert not path.exists()


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "result.json"
    write_result(path, _result())
    before = path.read_text()
    with pytest.raises(TypeError):  # not JSON-serialisable
        write_result(path, _result(method_settings={"dtype": object()}))
    assert path.read_text() == before
    with pytest.raises(UnicodeEncodeError):  # fails while writing the temporary file
        atomic_write_text(path, "half a file \udc80")
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["result.json"]


def test_atomic_write_text_replaces(tmp_path):
    path = tmp_path / "sub" / "x.txt"
    atomic_write_text(path, "one\n")
    atomic_write_text(path, "two\n")
    assert path.read_text() == "two\n"
    assert os.listdir(path.parent) == ["x.txt"]


def test_read_result_fills_missing_and_drops_unknown(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"status": "oom", "model": "m", "legacy_field": 3}))
    back = read_result(path)
    assert list(back) == list(RESULT_FIELDS)
    assert back["status"] == "oom" and back["model"] == "m"
    assert "legacy_field" not in back


def test_write_steps_one_json_line_per_step(tmp_path):
    path = tmp_path / "steps.jsonl"
    steps = [{"step": i, "time_s": 0.1 * (i + 1), "loss": 10.0 - i, "warmup": i < 2} for i in range(7)]
    write_steps(path, steps)
    text = path.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 7
    assert [json.loads(line) for line in lines] == steps
    assert os.listdir(tmp_path) == ["steps.jsonl"]


def test_write_steps_empty(tmp_path):
    path = tmp_path / "steps.jsonl"
    write_steps(path, [])
    assert path.read_text() == ""
