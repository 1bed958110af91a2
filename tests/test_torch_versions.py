"""The capture in the user's torch (issue 38 item 1): version keys, the installed torch's own rules, meta kernels
older releases lack, and the notes ``run --gpu`` / ``scale`` / ``fit`` give when the trace's torch is not the GPU run's.

Everything here runs in this process on the installed torch (CI: 2.13.0 CPU), no capture child: the other
releases are exercised by ``python -m validate torch-matrix`` (docs/capture.md has its table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

import torch  # noqa: E402

from allocsim.torch_capture import meta_kernels, sdpa, torch_versions  # noqa: E402
from allocsim.torch_capture import cuda_scratch  # noqa: E402
from allocsim.torch_release import check_target, inputs_check, torch_check  # noqa: E402
from allocsim.trace.formats.kineto.fast import document_torch, recorded_torch  # noqa: E402
from validate import torch_env, torch_matrix  # noqa: E402


def test_versions_parse_to_releases():
    assert torch_versions.parse("2.6.0+cu124") == (2, 6)
    assert torch_versions.parse("2.15.0a0+git1234") == (2, 15)
    assert torch_versions.parse("2.13") == (2, 13)
    assert torch_versions.parse("abc") is None and torch_versions.parse(None) is None
    assert torch_versions.differ("2.6.0+cu124", "2.13.0+cpu") and not torch_versions.differ("2.6.0", "2.6.0+cu124")
    assert torch_versions.installed() == torch_versions.parse(torch.__version__)
    assert torch_versions.supported((2, 4)) and torch_versions.supported((2, 15))
    assert not torch_versions.supported((2, 3)) and not torch_versions.supported((2, 16))


def test_wheels_are_keyed_by_release_and_sdpa_rules_take_them():
    # the pins read from each release's Requires-Dist (nvidia-cudnn-cu12 9.1.0.70 for 2.4 to 2.6, ...)
    assert torch_versions.wheel_for((2, 4)).cudnn == torch_versions.wheel_for((2, 6)).cudnn == 90100
    assert torch_versions.wheel_for((2, 7)).cudnn == 90501
    assert torch_versions.wheel_for((2, 9)).cudnn == 91002
    assert torch_versions.wheel_for((2, 15)) == torch_versions.Wheel("13.2", 92600)
    assert torch_versions.wheel_for((2, 3)) == torch_versions.WHEELS[(2, 4)]     # below the table: its oldest
    assert torch_versions.wheel_for((2, 99)) == torch_versions.WHEELS[(2, 15)]
    for version in torch_versions.WHEELS:
        rules = sdpa.rules_for(version)
        assert rules.cudnn_version == torch_versions.wheel_for(version).cudnn
        assert rules.cuda_major == int(torch_versions.wheel_for(version).cuda.split(".")[0])
    # a CPU build answers its release's PyPI wheel; a CUDA build its own cuDNN
    expected = torch_versions.build_cudnn() or torch_versions.wheel_for(torch_versions.installed()).cudnn
    assert torch_versions.cudnn_version() == expected


def test_the_installed_reduce_header_agrees_with_the_release_key():
    rule = torch_versions.reduce_vectorization()
    assert rule == torch_versions.reduce_vectorization(torch_versions.installed())
    text = torch_versions._reduce_header()
    assert text is not None and torch_versions.reduce_rule_of_header(text) == rule
    assert torch_versions.use_installed_reduce_rule() == rule       # what the capture's reductions follow
    # the three rules as the headers write them (2.4 - 2.6; 2.7 - 2.9; 2.13), the ROCm branch skipped
    cond = "    if (reduction_on_fastest_striding_dimension && dim0 {} 128 && iter.num_reduce_dims() == 1{}) {{"
    vec4 = ("  static constexpr int input_vec_size = 4;\n"
            + cond.format(">", " && vt0 >= ReduceConfig::input_vec_size"))
    gated = ("template <typename scalar_t, int vt0=4, int input_vec_size=vt0>\n#ifdef USE_ROCM\n"
             + cond.format(">=", "") + "\n#else\n" + cond.format(">", " && vt0 >= input_vec_size") + "\n#endif")
    ungated = "template <typename scalar_t, int vt0=4, int input_vec_size=vt0>\n" + cond.format(">=", "")
    assert torch_versions.reduce_rule_of_header(vec4) == "vec4"
    assert torch_versions.reduce_rule_of_header(gated) == "per_kernel_gated"
    assert torch_versions.reduce_rule_of_header(ungated) == "per_kernel"
    assert torch_versions.reduce_rule_of_header("nothing here") is None
    assert [torch_versions.reduce_rule_for(v) for v in ((2, 4), (2, 6), (2, 7), (2, 9), (2, 13), (2, 15))] == \
        ["vec4", "vec4", "per_kernel_gated", "per_kernel_gated", "per_kernel", "per_kernel"]


def test_scratch_rules_switch_at_the_keyed_releases():
    x = cuda_scratch.TensorMeta.contiguous((70400, 64), "float32")
    w = cuda_scratch.TensorMeta.contiguous((64,), "float32")
    before = cuda_scratch.layer_norm_backward_scratch(x, x, 1, w, w, gpu="H100", torch_version=(2, 6))
    after = cuda_scratch.layer_norm_backward_scratch(x, x, 1, w, w, gpu="H100",
                                                     torch_version=torch_versions.LAYER_NORM_TWO_PASS)
    assert before == [] and any("dgamma_blocks" in r.label for r in after)


def test_stream_bases_are_plain_where_torch_streambase_is_an_alias():
    stream, event = torch_versions.stream_bases()
    from torch import _streambase

    if getattr(_streambase._StreamBase, "__abstractmethods__", None):        # torch 2.4 / 2.5
        assert stream == (_streambase._StreamBase,) and event == (_streambase._EventBase,)
    else:
        assert stream == () and event == ()


def _meta_qkv(b=2, h=4, length=100, d=64, dtype=torch.bfloat16):
    return [torch.empty(b, h, length, d, dtype=dtype, device="meta") for _ in range(3)]


def test_meta_kernels_match_the_outputs_torchs_own_meta_kernels_allocate():
    """On a torch that has them (2.5 on), allocsim's kernels give outputs of the same storage sizes."""
    q, k, v = _meta_qkv()
    aten = torch.ops.aten
    flash_ours = meta_kernels._flash(aten._scaled_dot_product_flash_attention.default)(q, k, v, 0.0, True)
    flash_torch = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    eff = aten._scaled_dot_product_efficient_attention.default
    eff_ours = meta_kernels._efficient(eff)(q, k, v, None, True)
    eff_torch = eff(q, k, v, None, True)
    for ours, theirs in ((flash_ours, flash_torch), (eff_ours, eff_torch)):
        for i in (0, 1):       # output and log-sum-exp
            assert ours[i].shape == theirs[i].shape and ours[i].dtype == theirs[i].dtype
            assert ours[i].untyped_storage().nbytes() == theirs[i].untyped_storage().nbytes()
    # CUDA's flash output is stored (batch, length, heads, head size); seed and offset stay on the host
    assert flash_ours[0].transpose(1, 2).is_contiguous()
    assert flash_ours[6].device.type == "cpu" and eff_ours[2].device.type == "cpu"
    assert eff_ours[1].shape == (2, 4, 128)           # 100 rows rounded up to 32
    assert meta_kernels._efficient(eff)(q, k, v, None, False)[1].shape == (2, 4, 0)


def test_meta_kernels_install_only_what_this_torch_lacks():
    missing = meta_kernels.missing()
    if torch_versions.installed() >= (2, 5):
        assert missing == []
    assert meta_kernels.install() == missing


class _Meta(SimpleNamespace):
    pass


def test_torch_check_notes_a_capture_or_recording_of_another_release():
    capture = _Meta(version_hints={"torch": "2.6.0+cu124", "capture": "cuda on meta"})
    recording = _Meta(version_hints={"torch": "2.6.0+cu124"})
    unknown = _Meta(version_hints={})
    assert torch_check(capture)["note"] is None and torch_check(capture)["target_torch"] == "2.6.0+cu124"
    assert torch_check(capture, "2.6")["note"] is None
    same = torch_check(capture, "2.13")
    assert same["differs"] and "captured with torch 2.6.0+cu124" in same["note"] and "/path/to/python" in same["note"]
    other = torch_check(recording, "2.13.0")
    assert other["differs"] and other["note"].startswith("recorded with torch 2.6.0+cu124")
    assert not torch_check(unknown, "2.13")["differs"] and "does not say" in torch_check(unknown, "2.13")["note"]
    mixed = inputs_check([capture, _Meta(version_hints={"torch": "2.13.0+cpu", "capture": "cuda on meta"})])
    assert mixed["differs"] and "different torch releases" in mixed["note"]
    assert inputs_check([capture, capture])["note"] is None
    with pytest.raises(ValueError, match="not a torch version"):
        check_target("latest")


def test_kineto_metadata_names_its_torch():
    assert recorded_torch(b'{"system": {"torch_env_info": {"torch_version": "2.6.0+cu124"}}}') == "2.6.0+cu124"
    assert recorded_torch({"torch_env_info": {"torch_version": "2.7.1"}}) == "2.7.1"
    assert recorded_torch(b'{"system": 3}') is None and recorded_torch(b"null") is None
    doc = json.dumps({"traceEvents": [], "metadata": {"system": {"torch_env_info": {"torch_version": "2.5.1"}}}})
    assert document_torch(doc.encode()) == "2.5.1"
    assert document_torch(b'{"traceEvents": []}') is None


@pytest.mark.shared
def test_a_tracelens_trace_says_torch_and_run_gpu_notes_the_difference(shared_dir):
    path = shared_dir / "traces" / "kineto-gpu" / "AMD-AGI_TraceLens_h100_bert-small.json.gz"
    done = subprocess.run([sys.executable, "-m", "allocsim", "run", str(path), "--policy", "pytorch", "--fast",
                           "--gpu", "H100", "--torch", "2.13", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    estimate = json.loads(done.stdout)["gpu_estimate"]
    assert estimate["torch"]["trace_torch"] == "2.6.0+cu124" and estimate["torch"]["differs"]
    assert "recorded with torch 2.6.0+cu124, the GPU run uses torch 2.13" in json.loads(done.stdout)["verdict"]["line"]


def test_torch_env_reads_requirements_and_maps_libraries_to_packages():
    metadata = ("Requires-Dist: filelock\nRequires-Dist: nvidia-cudnn-cu12 (==9.1.0.70) ; platform_system == \"Linux\"\n"
                "Requires-Dist: nvidia-cublas-cu12==12.4.5.8; platform_system == \"Linux\"\n"
                "Requires-Dist: optree (>=0.11.0) ; extra == 'optree'\n")
    reqs = torch_env.requirements(metadata)
    assert [r[0] for r in reqs] == ["filelock", "nvidia-cudnn-cu12", "nvidia-cublas-cu12"]
    pins = torch_env.nvidia_pins(reqs, {"libcudnn.so.9", "libcublasLt.so.12", "libcudart.so.12"})
    assert pins == ["nvidia-cudnn-cu12==9.1.0.70", "nvidia-cublas-cu12==12.4.5.8"]
    assert torch_env._package_of("libcusparseLt-f80c68d1.so.0") == "nvidia-cusparselt"
    assert torch_env._package_of("libcusparse.so.12") == "nvidia-cusparse"
    assert torch_env._package_of("libnvshmem_host.so.3") == "nvidia-nvshmem"
    # torch 2.5 pins sympy per Python version: only the line whose marker holds here is installed
    assert not torch_env.marker_holds('python_version == "3.8"') and torch_env.marker_holds("")


def test_torch_matrix_marks_the_recordings_release_and_counts_exact_rows():
    real = {"requested": 100, "allocated": 200, "reserved": 300}
    exact = {"status": "ok", "real": real, "capture": real, "error": {"requested": 0.0, "allocated": 0.0,
                                                                      "reserved": 0.0}}
    off = {"status": "ok", "real": real, "capture": real, "error": {"requested": 0.05, "allocated": 0.05,
                                                                    "reserved": 0.05}}
    result = {"versions": [{"python": "a", "torch": "2.6.0+cu124"}, {"python": "b", "torch": "2.13.0+cpu"}],
              "fixtures": {"mlp": {"2.6.0+cu124": {"peaks": real, "allocs": 3}, "2.13.0+cpu": {"error": "boom"}}},
              "series": {"f.pickle": {"series": "s", "size": 128, "precision": "fp32", "recorded_torch": "2.6.0",
                                      "by_version": {"2.6.0+cu124": exact, "2.13.0+cpu": off}}}}
    text = torch_matrix.format_matrix(result)
    assert "**+0.000% / +0.000%**" in text and "+5.000% / +5.000%" in text and "fails: boom" in text
    counts = torch_matrix.summarize(result)
    assert counts["2.6.0+cu124"]["same_release_exact"] == 1 and counts["2.6.0+cu124"]["same_release_rows"] == 1
    assert counts["2.13.0+cpu"]["same_release_rows"] == 0 and counts["2.13.0+cpu"]["series_on_target"] == 0
    assert counts["2.13.0+cpu"]["fixtures_captured"] == 0
    assert not torch_matrix.same_release(None, "2.6.0")


SMALL = """
import torch
model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def captured_with_interpreter(tmp_path_factory):
    """One capture made as the docs show it: ``allocsim capture -o train.parquet -- /path/to/python train.py``."""
    folder = tmp_path_factory.mktemp("interp")
    (folder / "train.py").write_text(SMALL)
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", "train.parquet", "--",
                           sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder


def _cli(folder, *args):
    done = subprocess.run([sys.executable, "-m", "allocsim", *args], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_capture_in_the_training_interpreter_names_its_torch_and_run_gpu_notes_another(captured_with_interpreter):
    folder = captured_with_interpreter
    same = json.loads(_cli(folder, "run", "train.parquet", "--policy", "pytorch", "--gpu", "H100", "--fast", "--json"))
    assert same["gpu_estimate"]["torch"] == {"trace_torch": torch.__version__, "captured": True,
                                             "target_torch": torch.__version__, "differs": False, "note": None}
    other = "2.6" if torch_versions.installed() != (2, 6) else "2.13"
    text = _cli(folder, "run", "train.parquet", "--policy", "pytorch", "--gpu", "H100", "--torch", other, "--fast")
    verdict = text.strip().splitlines()[-1]
    assert f"captured with torch {torch.__version__}, the GPU run uses torch {other}: releases allocate " in verdict
    assert "-- /path/to/python train.py" in verdict



def test_a_cpu_matmul_takes_no_cublas_workspace():
    """torch 2.6's torch._dynamo runs ``a @ b`` on CPU tensors when imported (einx imports it): no device request."""
    from allocsim.torch_capture.channel import NullChannel
    from allocsim.torch_capture.tracker import StorageTracker

    tracker = StorageTracker(NullChannel(), {"name": "A100 80GB", "major": 8, "minor": 0})
    mm = torch.ops.aten.mm.default
    a = torch.ones(2, 2)
    tracker.on_operator(mm, (a, a), {}, mm(a, a))
    assert tracker.n_allocs == 0 and tracker.cublas.bytes
    m = torch.empty(2, 2, device="meta")
    out = mm(m, m)
    tracker.on_operator(mm, (m, m), {}, out)
    assert tracker.n_allocs == 2            # the output and the first cuBLAS workspace of this thread
