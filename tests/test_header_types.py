"""A trace header whose values have the wrong type is refused where the trace is read (issue 40).

Every field of a header that holds every field allocsim reads (a snapshot's recorded run with an
OOM, a capture's card, Kineto's device properties, a scaled trace's hints) is replaced, one at a
time, by values of every other JSON type: ``read_trace`` answers with a ``TraceFormatError`` that
names the file and the field, never an ``AttributeError`` later in a command. Fields that are
free-form (objects of ``Any``) take anything, and the commands that read a header (``info``,
``run``, ``run --gpu``, ``advise``, ``report``) still give one line, exit 2, for a bad one.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from allocsim.errors import TraceFormatError
from allocsim.trace import read_trace, write_trace
from tests.attack_files import valid_snapshot

#: One value of each JSON kind; a field is given every kind but its own.
KINDS = {"null": None, "boolean": True, "integer": 7, "number": 1.5, "string": "x", "list": [], "object": {}}
#: Objects whose values are free-form (``dict[str, Any]`` in allocsim's types): not descended into.
FREE_FORM = {"meta.version_hints.device_types_seen", "meta.version_hints.cudnn_workspace_ratios",
             "meta.version_hints.autocast", "meta.allocator_settings", "meta.recorded.0.settings",
             "meta.recorded.0.release_points.0"}
#: Fields allocsim's types allow to be null (``X | None``).
NULLABLE = {"meta.allocator_settings", "meta.recorded.0.settings", "meta.recorded.0.capacity_bytes",
            "meta.recorded.0.capacity_range", "meta.recorded.0.capacity_range.1", "meta.recorded.0.peak_allocated_bytes",
            "meta.version_hints.cublas_workspace_bytes",
            *(f"meta.recorded.0.{name}" for name in (
                "start_reserved_bytes", "peak_reserved_bytes", "final_reserved_bytes", "segment_allocs",
                "segment_alloc_bytes", "segment_frees", "segment_free_bytes", "segment_maps", "segment_map_bytes",
                "segment_unmaps", "segment_unmap_bytes"))}


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "list", dict: "object"}[type(value)]


def _full_meta(meta: dict) -> dict:
    """``meta`` with a value in every field allocsim reads."""
    meta = copy.deepcopy(meta)
    meta["version_hints"].update({
        "converted_from": "pytorch-snapshot", "converted_from_file": "a.pickle", "source_format": "pytorch-snapshot",
        "size_bytes": "request", "cublas_workspaces": "in trace", "cublas_workspace_bytes": 8519680,
        "device_types_seen": {"CUDA": 3}, "torch": "2.13.0", "capture": "cuda on meta", "optimizer_steps": 2,
        "categories": "capture", "cudnn_workspace_ratios": {"kernel": 1.0}, "autocast": {"cuda": False},
        "gpu": {"name": "A100 80GB", "total_bytes": 85_000_000_000, "major": 8, "minor": 0, "sm_count": 108,
                "max_threads_per_sm": 2048, "context_bytes": 400 << 20},
        "scale": {"scale_name": "batch", "target": "8", "frames": "code", "start_layout": "placed",
                  "range": {"alloc_id": [1], "low": [512], "high": [1024]}},
    })
    meta["device_properties"] = {"0": {"name": "NVIDIA A100-SXM4-80GB", "total_bytes": 85_000_000_000}}
    run = meta["recorded"]["0"]
    run.update(capacity_bytes=80 << 30, capacity_range=[1 << 30, None], settings={"max_split_size_mb": 64},
               release_points=[{"event_index": 1, "mode": "oom"}], unmodelled=["a sentence"],
               ooms=[{"event_index": 1, "t_ns": 5, "requested_bytes": 512, "stream": 0, "device_free_bytes": -1,
                      "reserved_bytes": 1024}])
    meta["time_synthesized"] = False
    meta["repairs"], meta["notes"] = ["a repair"], ["a note"]
    return meta


def _fields(value, path: str):
    """Every (path, value) below ``value``, containers before their items; free-form objects not entered."""
    yield path, value
    if path in FREE_FORM:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _fields(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _fields(item, f"{path}.{i}")


def _named(header: dict, path: str) -> str:
    """``path`` as the error names it: list items as ``[i]``, object keys after a dot."""
    parts = path.split(".")
    node, out = header, parts[0]
    node = node[parts[0]]
    for part in parts[1:]:
        if isinstance(node, list):
            out, node = out + f"[{part}]", node[int(part)]
        else:
            out, node = out + f".{part}", node[part]
    return out


def _set(header: dict, path: str, new) -> dict:
    header = copy.deepcopy(header)
    parts = path.split(".")
    node = header
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = new
    else:
        node[last] = new
    return header


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """An allocsim Parquet trace (from a snapshot) and its header with every field filled in."""
    folder = tmp_path_factory.mktemp("header")
    path, _ = valid_snapshot(folder, random.Random(3))
    out = folder / "t.parquet"
    write_trace(read_trace(str(path)), out)
    table = pq.read_table(out)
    header = json.loads(table.schema.metadata[b"allocsim"])
    header["meta"] = _full_meta(header["meta"])
    return folder, table, header


def _write(table, header: dict, path: Path) -> Path:
    metadata = {**table.schema.metadata, b"allocsim": json.dumps(header).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path


#: The kind of the fields the header holds as null (they are ``X | None``).
NULL_KINDS = {"meta.allocator_settings": "object", "meta.recorded.0.peak_allocated_bytes": "integer",
              "meta.recorded.0.capacity_range.1": "integer"}


def _mutations(header: dict):
    from allocsim.trace.reading.header import VERSION_HINTS

    for path, value in _fields(header["meta"], "meta"):
        parts = path.split(".")
        if path == "meta" or (parts[1] == "version_hints" and len(parts) > 2 and parts[2] not in VERSION_HINTS):
            continue        # a hint allocsim does not read: free-form (test_free_form_values_take_anything)
        own = NULL_KINDS.get(path) if value is None else _kind(value)
        for kind, new in KINDS.items():
            if kind == own or (kind == "integer" and own == "number"):
                continue
            if kind == "null" and path in NULLABLE:
                continue
            if path.rsplit(".", 1)[0] in FREE_FORM:     # an item of a free-form object takes anything
                continue
            yield path, kind, new


def test_the_full_header_reads(base):
    folder, table, header = base
    trace = read_trace(str(_write(table, header, folder / "full.parquet")))
    assert trace.meta.version_hints["gpu"]["name"] == "A100 80GB" and trace.meta.recorded["0"]["ooms"]


def test_every_field_of_every_wrong_type_is_refused_at_read(base):
    folder, table, header = base
    target = folder / "mutated.parquet"
    checked, fields = 0, set()
    for path, kind, new in _mutations(header):
        _write(table, _set(header, path, new), target)
        with pytest.raises(TraceFormatError) as info:
            read_trace(str(target))
        shown = str(info.value)
        # the file, then the field (list items as [i]), then what it holds
        assert shown.startswith(f"{target}: header field {_named(header, path)}: holds "), (path, kind, shown)
        checked += 1
        fields.add(path)
    # every field of the header was tried (the test is not vacuous)
    assert len(fields) >= 60 and checked >= 6 * 50, (len(fields), checked)


def test_free_form_values_take_anything(base, cli, tmp_path):
    """Hints allocsim does not read (a reader's notes on the file, Kineto's top-level keys) and the
    insides of free-form objects hold anything, and every command still reads the trace."""
    from allocsim.trace.reading.header import VERSION_HINTS

    folder, table, header = base
    junk = {"deep": ["anything", 1.5, None, {"x": True}]}
    mutated = header
    for path in FREE_FORM - {"meta.allocator_settings", "meta.recorded.0.settings"}:
        mutated = _set(mutated, path, junk)
    hints = mutated["meta"]["version_hints"]
    free = [key for key in hints if key not in VERSION_HINTS]
    assert len(free) >= 5, free            # the snapshot reader's notes on the file
    for key in [*free, "unknown_key"]:
        hints[key] = junk
    path = _write(table, mutated, folder / "free.parquet")
    assert read_trace(str(path)).meta.version_hints["unknown_key"] == junk
    for argv in (["info", path], ["run", path, "--policy", "pytorch", "--gpu", "H100"], ["report", path, "-o", tmp_path / "page.html"]):
        code, out, err = cli(*argv)
        assert code in (0, 1) and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("field, value", [("meta.recorded.0", "strings"), ("meta.recorded.0.peak_reserved_bytes", "7"),
                                          ("meta.version_hints.gpu", "A100"), ("meta.device_properties.0", 5)])
def test_commands_answer_one_line(base, cli, tmp_path, field, value):
    folder, table, header = base
    path = _write(table, _set(header, field, value), tmp_path / "bad.parquet")
    for argv in (["info", path], ["run", path, "--policy", "pytorch"], ["run", path, "--policy", "pytorch", "--gpu", "H100"], ["advise", path, "--capacity", "1GiB"],
                 ["report", path, "-o", tmp_path / "page.html"]):
        code, out, err = cli(*argv)
        assert code == 2 and "Traceback" not in err and "AttributeError" not in err, (argv, err)
        line = err.strip().splitlines()[-1]
        assert str(path) in line and field.rsplit(".", 1)[0] in line, (argv, line)
